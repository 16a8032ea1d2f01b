fn main() {
    std::process::exit(m0serve::app::main());
}
