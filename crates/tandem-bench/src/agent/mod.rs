//! The multi-turn agent benchmark: sessions run concurrently against one OpenAI-compatible
//! endpoint; every turn appends a tool result and a user message and replays the whole
//! history, as real agent clients do, then waits the think time.

mod results;
mod run;

pub use results::{Overall, SessionResult, SystemResult, TurnResult};
pub use run::{run_system, SystemConfig};
