//! Progress bars for the long commands (import, eval, bench): on a terminal only, so logs and
//! CI output stay one line per result.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps named `what`; hidden when stderr is not a terminal.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    if let Ok(style) =
        ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} {per_sec} eta {eta}")
    {
        bar.set_style(style);
    }
    bar.set_message(what.to_string());
    bar
}
