//! Headless Chromium for the HTML render checks: pages write the result of their own
//! check into `#render-check`, which `--dump-dom` reveals.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium, or None (with a loud message) when it is missing and not required.
pub fn chromium() -> Option<PathBuf> {
    if Path::new(CHROMIUM).exists() {
        return Some(PathBuf::from(CHROMIUM));
    }
    if std::env::var_os("HALYARD_REQUIRE_BROWSER").is_some() {
        panic!("{CHROMIUM} is missing and HALYARD_REQUIRE_BROWSER is set (scripts/setup installs chromium)");
    }
    eprintln!("\n\n*** SKIPPING the HTML browser check: {CHROMIUM} not found (apt-get install chromium) ***\n\n");
    None
}

/// Chromium with the flags this sandbox-less, offline machine needs.
pub fn browser(bin: &Path, profile: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
    ]);
    c.arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// The value of attribute `name` in the tag holding `id="render-check"`.
pub fn check_attr(dom: &str, name: &str) -> Option<String> {
    let start = dom.find("id=\"render-check\"")?;
    let tag_start = dom[..start].rfind('<')?;
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>')?];
    let key = format!("{name}=\"");
    let i = tag.find(&key)? + key.len();
    Some(tag[i..i + tag[i..].find('"')?].to_string())
}

/// Load `page` in Chromium and return the render check's attributes through `attr`.
pub fn render_check(bin: &Path, page: &Path) -> impl Fn(&str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}", page.display());
    let dump =
        browser(bin, profile.path()).arg("--dump-dom").arg(&url).output().expect("run chromium");
    assert!(dump.status.success(), "chromium failed: {}", String::from_utf8_lossy(&dump.stderr));
    let dom = String::from_utf8_lossy(&dump.stdout).into_owned();
    move |n: &str| {
        check_attr(&dom, n).unwrap_or_else(|| {
            panic!("no {n} on #render-check; DOM tail: {}", &dom[dom.len().saturating_sub(600)..])
        })
    }
}
