//! The axum and tonic conveniences: the request's `Scope` and `Admission` as axum
//! extractors over a real axum server, a clear rejection without the layer, and the crate's
//! errors as responses and `tonic::Status` by the server layer's table.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::retry::{Decision, Retry};
use cancel_scope::wire::{Admission, EndpointPolicy, Incoming, ServerScope};
use cancel_scope::{ChildSpec, Error, Scope};
use http::StatusCode;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn budget(scope: Scope, admission: Admission) -> String {
    format!(
        "{} {}",
        scope.remaining().unwrap() <= admission.initial_remaining(),
        admission.operation_id() == scope.operation().unwrap().id()
    )
}

/// Fails with `how`: a budget too small for a dependency (504), or a cancelled dependency
/// after a write went out (500, `unknown`), or before (503, `none`).
async fn fails(
    scope: Scope,
    axum::extract::Path(how): axum::extract::Path<String>,
) -> Result<String, Error> {
    if how == "exhausted" {
        scope.child().min_useful(Duration::from_secs(600)).build()?;
    }
    if how == "after-write" {
        let write = scope.register(ChildSpec::side_effecting("pay", "pay-1"))?;
        write.dispatch()?.succeed();
    }
    let dependency = scope.child().build()?;
    dependency.cancel();
    dependency.run(async {}).await?;
    Ok(String::new())
}

#[tokio::test]
async fn extractors_and_errors_behind_the_layer() {
    let policy = EndpointPolicy::builder(ms(60_000))
        .default_budget(ms(30_000))
        .build();
    let admitted = Router::new()
        .route("/budget", get(budget))
        .route("/fails/{how}", get(fails))
        .layer(AdmitLayer::new(policy));
    let url = serve(admitted).await;
    let client = reqwest::Client::new();
    let get = |path: &str| client.get(format!("{url}{path}")).send();

    let res = get("/budget").await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "true true");

    let res = get("/fails/exhausted").await.unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.text().await.unwrap(), "budget exhausted");

    let res = get("/fails/before-write").await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["service-effect"], "none");
    assert_eq!(res.text().await.unwrap(), "service unavailable");

    let res = get("/fails/after-write").await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.headers()["service-effect"], "unknown");
}

#[tokio::test]
async fn without_the_layer_the_extractors_say_it_is_missing() {
    let bare = Router::new().route("/budget", get(budget));
    let url = serve(bare).await;
    let res = reqwest::get(format!("{url}/budget")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let text = res.text().await.unwrap();
    assert!(text.contains("no AdmitLayer"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn errors_become_statuses_by_the_layers_table() {
    use axum::response::IntoResponse;
    use tonic::Code;

    let both = |e: &dyn Fn() -> Error| {
        let http = e().into_response();
        let grpc = tonic::Status::from(e());
        (http.status().as_u16(), grpc.code())
    };
    let cancelled = Scope::new();
    cancelled.cancel();
    assert_eq!(
        both(&|| cancelled.child().build().unwrap_err()),
        (503, Code::Unavailable)
    );
    let deadline = Scope::with_timeout(ms(10));
    deadline.cancelled().await;
    assert_eq!(
        both(&|| deadline.child().build().unwrap_err()),
        (504, Code::DeadlineExceeded)
    );
    let short = Scope::with_timeout(ms(10));
    assert_eq!(
        both(&|| short.child().min_useful(ms(50)).build().unwrap_err()),
        (504, Code::DeadlineExceeded)
    );

    // Admission refusals: 400 / INVALID_ARGUMENT, and a draining server's 503.
    let policy = EndpointPolicy::builder(ms(1_000)).build();
    let bad = || {
        policy.admit(
            Incoming::new().grpc_timeout(b"soon"),
            tokio::time::Instant::now(),
        )
    };
    let res = bad().unwrap_err().into_response();
    assert_eq!(res.status(), 400);
    assert!(res.headers().get("service-effect").is_none());
    assert_eq!(
        tonic::Status::from(bad().unwrap_err()).code(),
        Code::InvalidArgument
    );
    let server = ServerScope::new();
    server.shutdown(Duration::ZERO).await;
    let late = policy
        .admit_in(&server, Incoming::new(), tokio::time::Instant::now())
        .unwrap_err();
    assert_eq!(tonic::Status::from(late).code(), Code::Unavailable);

    // A side-effecting retry that stopped with its effect unknown: 500 / UNKNOWN, `unknown`.
    let scope = Scope::with_timeout(ms(1_000));
    let err = Retry::new(|_: &&str| Decision::EffectUnknown)
        .run(
            &scope,
            ChildSpec::side_effecting("pay", "pay-1"),
            |_| async { Err::<(), _>("timed out after sending") },
        )
        .await
        .unwrap_err();
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), Code::Unknown);
    assert_eq!(status.message(), "effect unknown");
    assert_eq!(status.metadata().get("service-effect").unwrap(), "unknown");
}
