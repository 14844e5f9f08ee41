//! The main demonstration: frontend → orders → inventory → external-stub, real axum servers on
//! loopback, once with per-hop timeouts and once with scoped budgets. A client with 2 s goes
//! through; a client with 100 ms gives up — and the report shows, per request id, which
//! services went on working for nobody. `--mode shadow` runs the scoped chain in shadow mode
//! (every hop reports what its budget would have done, nothing is enforced), then switches
//! every hop to enforcing without restarting a server and sends the failure request again.
//!
//! ```sh
//! cargo run --example service_chain                     # both modes
//! cargo run --example service_chain -- --mode per-hop   # or: scoped, both
//! cargo run --example service_chain -- --mode shadow    # scoped, in shadow mode, then enforced
//! cargo run --example service_chain -- --client-ms 60 --inventory-ms 500
//! cargo run --example service_chain -- --time-scale 5   # every duration x5 (a loaded machine)
//! cargo run --example service_chain 2>/dev/null         # the report without the log lines
//! ```
//!
//! The services are in `demo/src/chain.rs`. The report checks its own claims; the exit status
//! is 1 if one does not hold, 2 for bad options.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    cancel_scope_demo::init_logging();
    let args = std::env::args().skip(1);
    let status = cancel_scope_demo::cli(args, &mut std::io::stdout(), &mut std::io::stderr()).await;
    ExitCode::from(status)
}
