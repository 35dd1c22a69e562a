//! `GET /v1/models` and `GET /v1/models/{id}`: the one served model.

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;

use crate::error::ApiError;
use crate::state::AppState;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// vLLM extension: the context length.
    pub max_model_len: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

fn card(state: &AppState) -> ModelCard {
    let info = state.backend.info();
    ModelCard {
        id: info.id.clone(),
        object: "model",
        created: info.created,
        owned_by: "tandem",
        max_model_len: info.context_length,
    }
}

pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList { object: "list", data: vec![card(&state)] })
}

pub async fn get_model(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<ModelCard>, ApiError> {
    if id == state.backend.info().id {
        Ok(Json(card(&state)))
    } else {
        Err(ApiError::model_not_found(&id))
    }
}
