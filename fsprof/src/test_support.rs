//! What unit tests that read the running kernel need. Such a test does not pass quietly
//! without it: it fails, naming what is missing, unless FSPROF_SKIP_KERNEL_TESTS is set,
//! and then it says it was skipped.

/// The variable that lets kernel-reading unit tests skip where the kernel gives them nothing.
pub const SKIP_ENV: &str = "FSPROF_SKIP_KERNEL_TESTS";

/// Whether `test` can run: `available`; otherwise a failure naming `needs`, or with
/// `SKIP_ENV` set a line saying it was skipped (and false).
pub fn needs(test: &str, needs: &str, available: bool) -> bool {
    if available {
        return true;
    }
    assert!(
        std::env::var_os(SKIP_ENV).is_some(),
        "{test} needs {needs}: run it as root on a kernel with BTF, or set {SKIP_ENV}=1 to skip it"
    );
    eprintln!("SKIPPED {test}: no {needs} ({SKIP_ENV} is set)");
    false
}
