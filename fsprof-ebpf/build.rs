// Rebuild when bpf-linker changes: it is an undeclared dependency of the BPF link step.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
    // bpf-linker passes LLVM -bpf-expand-memcpy-in-order by default, which also makes every
    // memset a call to aya-ebpf's byte loop (45 calls, most zeroing 16 bytes); the verifier
    // walks that loop byte by byte at every call and state: 37 % of sched_switch's
    // instructions to verify. Without it LLVM writes the zeros as stores.
    println!("cargo:rustc-link-arg=--disable-expand-memcpy-in-order");
}
