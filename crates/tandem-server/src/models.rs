//! `GET /v1/models` and `GET /v1/models/{id}`: the one served model, once under each of its
//! names (its id first, then the aliases of `--served-model-name`, the catalogue alias and the
//! file name).

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

fn card(state: &AppState, id: &str) -> ModelCard {
    let info = state.backend.info();
    ModelCard {
        id: id.to_string(),
        object: "model",
        created: info.created,
        owned_by: "tandem",
        max_model_len: info.context_length,
    }
}

pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    let data = state.model_names().iter().map(|n| card(&state, n)).collect();
    Json(ModelList { object: "list", data })
}

/// A name the model answers to (any name with `--any-model`), else 404.
pub async fn get_model(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<ModelCard>, ApiError> {
    if state.serves(&id) || state.cfg.any_model {
        Ok(Json(card(&state, &id)))
    } else {
        Err(ApiError::model_not_found(&id))
    }
}
