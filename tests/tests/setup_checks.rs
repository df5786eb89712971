//! `scripts/check-libclang`, the libclang post-condition of `scripts/setup` (issue 14): it
//! accepts only what bindgen loads, the C API library, and refuses llvm's libclang-cpp
//! (which a machine can have without libclang, the case that broke a fresh install).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-libclang")
}

/// The check against a made-up root; LIBCLANG_PATH as given (or unset).
fn check(root: &Path, libclang_path: Option<&Path>) -> Output {
    let mut c = Command::new(script());
    c.arg("--root").arg(root).env_remove("LIBCLANG_PATH");
    c.env_remove("LD_LIBRARY_PATH").env_remove("LIBRARY_PATH");
    if let Some(p) = libclang_path {
        c.env("LIBCLANG_PATH", p);
    }
    c.output().expect("run scripts/check-libclang")
}

/// A tree with llvm-14's lib directory and the multiarch directory.
fn tree() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let llvm = t.path().join("usr/lib/llvm-14/lib");
    let multiarch = t.path().join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&llvm).unwrap();
    std::fs::create_dir_all(&multiarch).unwrap();
    (t, llvm, multiarch)
}

/// The real libclang of this machine, as the check finds it without a root.
fn real_libclang() -> Option<PathBuf> {
    let out = Command::new(script()).env_remove("LIBCLANG_PATH").output().ok()?;
    out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Only libclang-cpp (a real 64-bit ELF library) in llvm's lib directory: not found, and
/// the message says why.
#[test]
fn libclang_cpp_alone_does_not_count() {
    let (t, llvm, _) = tree();
    // Any real ELF shared object will do as a stand-in: it is never loaded as libclang.
    let elf = ["/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a system ELF library");
    std::fs::copy(elf, llvm.join("libclang-cpp.so.14")).unwrap();
    let out = check(t.path(), None);
    assert!(!out.status.success(), "libclang-cpp accepted: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("libclang-cpp does not count"));
}

/// A file named like libclang that is not a loadable library with the C API is refused.
#[test]
fn a_fake_libclang_is_refused() {
    let (t, llvm, multiarch) = tree();
    std::fs::write(llvm.join("libclang.so"), b"not an ELF file").unwrap();
    std::fs::copy("/bin/true", multiarch.join("libclang-14.so.1")).unwrap();
    assert!(!check(t.path(), None).status.success());
}

/// The real C API library, under the multiarch name Debian's libclang1 uses, is found
/// there; LIBCLANG_PATH, when set, is the only place looked at, as for bindgen.
#[test]
fn the_c_api_library_is_found_and_libclang_path_wins() {
    let Some(real) = real_libclang() else {
        // scripts/setup installs libclang-dev, so CI always has one.
        eprintln!("\n*** SKIPPING: no libclang on this machine (scripts/setup installs it) ***\n");
        return;
    };
    let (t, llvm, multiarch) = tree();
    let link = multiarch.join("libclang-14.so.1");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = check(t.path(), None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), link.display().to_string());
    // LIBCLANG_PATH naming a directory without it: not found, though the tree has one.
    assert!(!check(t.path(), Some(&llvm)).status.success());
    assert!(check(t.path(), Some(&multiarch)).status.success());
}
