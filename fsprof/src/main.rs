fn main() -> std::process::ExitCode {
    fsprof::cli::main()
}
