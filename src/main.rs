//! catalogsync binary entry point (temporary).
fn main() {
    match catalogsync::api::crds_yaml() {
        Ok(y) => print!("{y}"),
        Err(e) => eprintln!("{e}"),
    }
}
