//! `halyard report RUN…`: merge finished runs into a leaderboard (`leaderboard.md` and
//! `leaderboard.html`; see `halyard_coordinator::report::leaderboard`).

use std::path::{Path, PathBuf};

use halyard_coordinator::report::leaderboard;

use crate::NodeError;

/// Write the leaderboard of the runs in `runs` into `out`; returns its Markdown.
pub fn write(runs: &[PathBuf], out: &Path) -> Result<String, NodeError> {
    let lb = leaderboard::load(runs).map_err(NodeError::Usage)?;
    for w in &lb.warnings {
        tracing::warn!("{w}");
    }
    std::fs::create_dir_all(out)
        .map_err(|e| NodeError::io(format!("cannot create {}", out.display()), e))?;
    let md = leaderboard::render_markdown(&lb);
    for (name, text) in
        [("leaderboard.md", md.clone()), ("leaderboard.html", leaderboard::render_html(&lb))]
    {
        let p = out.join(name);
        std::fs::write(&p, text)
            .map_err(|e| NodeError::io(format!("cannot write {}", p.display()), e))?;
    }
    Ok(md)
}
