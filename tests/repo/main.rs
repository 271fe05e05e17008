//! Tests that need the repository, not only the published package: the storm
//! simulator (`crates/sim`, not published), `docs/MATRIX.md`, and the doc
//! comments of `crates/*` that `doc_imports` reads. Excluded from
//! the package (`include` in Cargo.toml); run one file with
//! `cargo test --all-features --test repo <file>::`.

mod binaries;

#[path = "../doc_imports.rs"]
mod doc_imports;
#[path = "../grpc_storm.rs"]
mod grpc_storm;
#[path = "../matrix.rs"]
mod matrix;
#[path = "../sim.rs"]
mod sim;
#[path = "../sim_breaker.rs"]
mod sim_breaker;
#[path = "../sim_hedge.rs"]
mod sim_hedge;
#[path = "../sim_pacing.rs"]
mod sim_pacing;
#[path = "../sim_shed.rs"]
mod sim_shed;
