//! The main demonstration of `cancel-scope`: a real service chain on loopback, once with
//! per-hop timeouts and once with scoped budgets.
//!
//! ```sh
//! cargo run --example service_chain            # both modes; exits non-zero if a claim fails
//! cargo run --example service_chain -- --mode scoped --client-ms 60 --inventory-ms 500
//! cargo run --example service_chain -- --time-scale 5   # every duration x5, for a loaded machine
//! ```
//!
//! Four axum servers on 127.0.0.1 (ephemeral ports, one process) call each other with reqwest:
//!
//! ```text
//! client ──> frontend ──> orders ──> inventory v1 (a read-only quote: 350 ms of work)
//!                           └──────> external-stub (only if inventory succeeded)
//! ```
//!
//! Two requests go down the chain, one from a client that gives up after 100 ms and one from a
//! client that has 2 s, and the report asserts what happened to each, by request id. Every hop
//! logs structured lines (`tracing`, on stderr) with the request id.
//!
//! * **Per-hop timeouts** (services as they are commonly written): each hop has its own fixed
//!   timeout and ignores its caller's budget; inventory's handler does not watch cancellation.
//!   When the client leaves, the dropped connections stop frontend and orders (so
//!   external-stub is not called), but inventory's quote works on to its end for nobody.
//! * **Scoped budgets**: the edge admits the client's budget (`grpc-timeout`) with
//!   [`AdmitLayer`](cancel_scope::integrations::tower::AdmitLayer), every hop runs its request
//!   in a scope and passes on what is left with
//!   [`send_scoped`](cancel_scope::integrations::reqwest::RequestBuilderExt::send_scoped), and
//!   inventory runs the same quote with [`Scope::spawn`](cancel_scope::Scope::spawn). The
//!   innermost deadline fires first; inventory stops within milliseconds of it,
//!   external-stub never sees the request, and every hop reports stable quiescence.
//!
//! * **Shadow mode** (`--mode shadow`, not part of `both`): the scoped chain, with every
//!   hop's [`PolicyHandle`](cancel_scope::wire::PolicyHandle) at version 1 in
//!   [shadow mode](cancel_scope::wire::Mode::Shadow): the failure request runs as with
//!   per-hop timeouts (no deadline is enforced below the hard cap; the client times out on its
//!   own, and only its leaving stops inventory's quote), while every hop's report says what
//!   its budget would have done ("would have cancelled at the deadline: finished N ms after
//!   the would-be deadline"). Then every hop's handle is set to version 2, enforcing, while
//!   the servers run on, and the failure request is sent again: stopped at its deadline, as in
//!   scoped mode, each hop's report naming version 2.
//!
//! The services are in `chain.rs`; what differs between the modes is a few marked lines.
//! The report checks its own claims; [`cli`] returns 1 if one does not hold. The claims are
//! about order and causes, with margins of tens of milliseconds at the default scale; on a
//! loaded machine `--time-scale N` multiplies every duration of the run (the client budgets,
//! the quote, the hop timeouts, the reserves and pads) so that they keep their proportions
//! with N times the margin. The demonstration's own tests run at scale 5.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main] async fn main() {
//! let (mut out, mut err) = (Vec::new(), Vec::new());
//! let args = ["--mode", "scoped", "--time-scale", "5"].map(String::from);
//! let status = cancel_scope_demo::cli(args, &mut out, &mut err).await;
//! let report = String::from_utf8(out).unwrap();
//! assert_eq!(status, 0, "{report}");
//! assert!(report.contains("Every claim holds."));
//! # }
//! ```

#![warn(unreachable_pub)]
#![forbid(unsafe_code)]

use std::io::Write;

mod chain;
mod options;
mod outcome;
mod record;
mod render;
mod run;

pub use chain::{FRONTEND_TIMEOUT, MIN_USEFUL, ORDERS_TIMEOUT, RESERVE, TRANSPORT_PAD};
pub use options::{
    Mode, Options, OptionsError, Parsed, DEFAULT_CLIENT_BUDGET, DEFAULT_INVENTORY_WORK, MAX_MS,
    MAX_TIME_SCALE, SUCCESS_BUDGET, USAGE,
};
pub use outcome::{Check, ClientOutcome, Group, ModeRun, RequestRun, Work};
pub use record::Hop;
pub use render::summary;
pub use run::{run_mode, DemoError, PATIENCE};

/// Exit status: every claim holds.
pub const EXIT_OK: u8 = 0;
/// Exit status: a claim does not hold.
pub const EXIT_CLAIM_FAILED: u8 = 1;
/// Exit status: bad options, or the servers could not start.
pub const EXIT_USAGE: u8 = 2;

/// The whole program: parses `args` (without the program name), runs the modes, writes each
/// mode's report and then the comparison to `out`, and returns the exit status
/// ([`EXIT_OK`], [`EXIT_CLAIM_FAILED`], [`EXIT_USAGE`]). Errors and usage go to `err`.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() {
/// let (mut out, mut err) = (Vec::new(), Vec::new());
/// let status = cancel_scope_demo::cli(["--mode".to_string()], &mut out, &mut err).await;
/// assert_eq!(status, cancel_scope_demo::EXIT_USAGE);
/// assert!(String::from_utf8(err).unwrap().contains("--mode needs a value"));
/// # }
/// ```
pub async fn cli<I>(args: I, out: &mut (dyn Write + Send), err: &mut (dyn Write + Send)) -> u8
where
    I: IntoIterator<Item = String>,
{
    let options = match Options::parse(args) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            let _ = writeln!(out, "{USAGE}");
            return EXIT_OK;
        }
        Err(e) => {
            let _ = writeln!(err, "service_chain: {e}\n\n{USAGE}");
            return EXIT_USAGE;
        }
    };
    let mut runs = Vec::new();
    for mode in options.modes() {
        match run_mode(mode, &options).await {
            Ok(run) => {
                let _ = write!(out, "{}", run.render());
                let _ = out.flush();
                runs.push(run);
            }
            Err(e) => {
                let _ = writeln!(err, "service_chain: {e}");
                return EXIT_USAGE;
            }
        }
    }
    let _ = write!(out, "{}", summary(&runs));
    let _ = out.flush();
    if runs.iter().all(ModeRun::passed) {
        EXIT_OK
    } else {
        EXIT_CLAIM_FAILED
    }
}

/// Sends the services' log lines to stderr: milliseconds since start, level, message, then
/// the fields (`hop`, `request_id`, ...). Does nothing if a subscriber is already set.
///
/// # Examples
///
/// ```
/// cancel_scope_demo::init_logging();
/// tracing::info!(hop = "frontend", request_id = "r-1", "started");
/// ```
pub fn init_logging() {
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_timer(SinceStart(std::time::Instant::now()))
        .try_init();
}

/// Log timestamps: milliseconds since the program started.
#[derive(Debug)]
struct SinceStart(std::time::Instant);

impl tracing_subscriber::fmt::time::FormatTime for SinceStart {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{:>8.1}ms", self.0.elapsed().as_secs_f64() * 1000.0)
    }
}
