// Rebuild when bpf-linker changes: it is an undeclared dependency of the BPF link step.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
