//! The request path under real load: an axum server answering a small handler, driven by
//! `wrk` on loopback, the ways a user would build it, side by side in one run:
//!
//! * `bare`: the handler alone;
//! * `timeout`: tower-http's `TimeoutLayer` (what users pick today for a per-request bound);
//! * `admit`: `AdmitLayer` (a request scope with the endpoint's default budget, no header);
//! * `timeout_hop`: `TimeoutLayer`, and the handler makes one call to a downstream hello
//!   server with a plain `reqwest` client;
//! * `admit_hop`: `AdmitLayer`, and the handler makes that call through the reqwest
//!   integration (`send_scoped`: a call scope, the budget headers written, the answer's body
//!   bounded by the request's deadline).
//!
//! Each side is this binary with `--serve <side>`, a process of its own on one runtime worker
//! pinned to core 0 (the downstream server of the hop sides runs on that worker too), with
//! `wrk` on core 1; the order of the sides rotates round by round. The figures are the
//! medians over the rounds of each round's ratio of a side to its anchor (`admit` to
//! `timeout`, `admit_hop` to `timeout_hop`).
//!
//! ```sh
//! apt-get install -y wrk
//! cargo bench --bench request_path --features __test-servers
//! ```
//!
//! Options after `--`: `--rounds N` (default 6), `--seconds N` (default 3), `--connections N`
//! (default 32).

use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::reqwest::RequestBuilderExt as _;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::EndpointPolicy;
use tower_http::timeout::TimeoutLayer;

#[path = "support/wrk.rs"]
mod wrk;

const SIDES: [&str; 5] = ["bare", "timeout", "admit", "timeout_hop", "admit_hop"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(args.get(i + 1).map_or("", String::as_str));
        return;
    }
    if !wrk::can_measure(&args, "request_path") {
        return;
    }
    let m = wrk::rounds(
        &SIDES,
        wrk::option(&args, "--rounds", 6).max(1),
        wrk::option(&args, "--seconds", 3),
        wrk::option(&args, "--connections", 32),
    );
    for (side, measured) in SIDES.iter().zip(&m) {
        wrk::print_side(side, measured);
    }
    wrk::print_ratio(("admit", &m[2]), ("timeout", &m[1]));
    wrk::print_ratio(("admit_hop", &m[4]), ("timeout_hop", &m[3]));
    wrk::print_ratio(("timeout", &m[1]), ("bare", &m[0]));
}

/// The downstream hello server of the hop sides, on the same runtime; its URL.
async fn downstream() -> String {
    let app = Router::new().route("/", get(|| async { "hello" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[derive(Clone)]
struct Hop {
    client: reqwest::Client,
    url: String,
}

/// The handler of `timeout_hop`: a plain call.
async fn plain_hop(State(hop): State<Hop>) -> String {
    let res = hop
        .client
        .get(&hop.url)
        .send()
        .await
        .expect("the downstream");
    res.text().await.expect("its body")
}

/// The handler of `admit_hop`: the call through the reqwest integration, in the request's
/// scope.
async fn scoped_hop(State(hop): State<Hop>) -> String {
    let res = hop
        .client
        .get(&hop.url)
        .send_scoped()
        .await
        .expect("the downstream");
    res.text().await.expect("its body")
}

/// The server of `side`; prints its address on the first line of stdout, then serves until
/// killed.
fn serve(side: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let side = side.to_owned();
    runtime.block_on(async move {
        let ms = Duration::from_millis;
        let admit = AdmitLayer::new(
            EndpointPolicy::builder(ms(2_000))
                .default_budget(ms(1_000))
                .build(),
        );
        let timeout = TimeoutLayer::with_status_code(http::StatusCode::GATEWAY_TIMEOUT, ms(1_000));
        let hello = || Router::new().route("/", get(|| async { "hello" }));
        let hop = || async {
            Hop {
                client: reqwest::Client::new(),
                url: downstream().await,
            }
        };
        let app = match side.as_str() {
            "bare" => hello(),
            "timeout" => hello().layer(timeout),
            "admit" => hello().layer(admit),
            "timeout_hop" => Router::new()
                .route("/", get(plain_hop))
                .with_state(hop().await)
                .layer(timeout),
            "admit_hop" => Router::new()
                .route("/", get(scoped_hop))
                .with_state(hop().await)
                .layer(admit),
            other => panic!("no side {other:?}"),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        axum::serve(listener, app).await.unwrap();
    });
}
