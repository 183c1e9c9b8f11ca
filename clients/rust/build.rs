// Finds libparallax without any build-time crate: PARALLAX_LIB_DIR (a build tree's
// clients/c, or an install's lib dir), else `pkg-config --libs parallax`, else a plain
// -lparallax for a library installed where the linker looks anyway.
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PARALLAX_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");

    if let Some(dir) = env::var_os("PARALLAX_LIB_DIR") {
        let dir = dir.to_string_lossy().into_owned();
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:rustc-link-lib=dylib=parallax");
        // This package's own tests and examples then run without LD_LIBRARY_PATH; a
        // dependent crate's binaries do not get this (cargo passes link-arg to this
        // package's targets only) and need the library on their loader path.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
        return;
    }
    if let Ok(out) = Command::new("pkg-config")
        .args(["--libs", "parallax"])
        .output()
    {
        if out.status.success() {
            let libs = String::from_utf8_lossy(&out.stdout).into_owned();
            for token in libs.split_whitespace() {
                if let Some(dir) = token.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={}", dir);
                    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
                } else if let Some(lib) = token.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib=dylib={}", lib);
                }
            }
            return;
        }
    }
    println!("cargo:rustc-link-lib=dylib=parallax");
}
