//! Wire codecs and per-request admission/egress overhead.
//!
//! `cargo bench --bench wire --features tower`
//!
//! Each group puts the operation next to an anchor (a bare integer format/parse for the
//! codecs, a bare `HeaderMap::insert` for the per-request work) so that the result is a
//! ratio, not an absolute time.

// `criterion_group!` defines a `pub fn` without documentation.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use cancel_scope::wire::{
    grpc_timeout, EgressPolicy, EndpointPolicy, Incoming, ServerScope, ServiceBudget,
};
use cancel_scope::Scope;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::header::{HeaderMap, HeaderName, HeaderValue};

#[path = "support/hello.rs"]
mod hello;

const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
const SERVICE_BUDGET: HeaderName = HeaderName::from_static("service-budget");

fn codecs(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire/codec");
    g.throughput(Throughput::Elements(1));
    let d = Duration::from_micros(1_234_567);
    g.bench_function("anchor: u64 to string", |b| {
        b.iter(|| black_box(1_234_567u64).to_string())
    });
    g.bench_function("grpc-timeout encode", |b| {
        b.iter(|| grpc_timeout::encode(black_box(d)))
    });
    g.bench_function("anchor: u64 parse", |b| {
        b.iter(|| black_box("1234567").parse::<u64>())
    });
    g.bench_function("grpc-timeout decode", |b| {
        b.iter(|| grpc_timeout::decode(black_box("1234567u")))
    });
    let budget = ServiceBudget::new(d)
        .with_operation_id("checkout-7f3a")
        .unwrap()
        .with_generation(3)
        .unwrap()
        .with_priority(2)
        .unwrap()
        .with_audit_deadline_unix_ms(1_767_225_600_000)
        .unwrap();
    let header = budget.to_header_value();
    g.bench_function("service-budget encode", |b| {
        b.iter(|| black_box(&budget).to_header_value())
    });
    g.bench_function("service-budget parse", |b| {
        b.iter(|| ServiceBudget::parse(black_box(&header)))
    });
    g.finish();
}

fn per_request(c: &mut Criterion) {
    // A worker thread runs the deadline drivers that every admitted root spawns (one per tree
    // with a deadline), as a server's runtime would.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let ms = Duration::from_millis;
    // Budgets far longer than the benchmark runs, so that nothing expires under it.
    let policy = EndpointPolicy::builder(ms(7_200_000))
        .default_budget(ms(1_000))
        .reserve(ms(20))
        .transport_pad(ms(5))
        .build();
    let mut request = HeaderMap::new();
    request.insert(GRPC_TIMEOUT, HeaderValue::from_static("1H"));
    request.insert(
        SERVICE_BUDGET,
        HeaderValue::from_static("v=1, rem=3600000, gen=3, op=\"checkout-7f3a\", prio=2"),
    );
    let (root, _) = policy
        .admit(
            Incoming::from_headers(&request),
            tokio::time::Instant::now(),
        )
        .unwrap();
    let egress = EgressPolicy::for_scope(&root);

    let mut g = c.benchmark_group("wire/per_request");
    g.throughput(Throughput::Elements(1));
    g.bench_function("anchor: one HeaderMap insert", |b| {
        b.iter(|| {
            let mut h = HeaderMap::new();
            h.insert(GRPC_TIMEOUT, HeaderValue::from_static("2S"));
            h
        })
    });
    g.bench_function(
        "anchor: Scope::with_timeout (a root with a deadline)",
        |b| b.iter(|| Scope::with_timeout(black_box(ms(3_600_000)))),
    );
    g.bench_function("admit (decode both headers, root scope)", |b| {
        b.iter(|| {
            policy
                .admit(
                    Incoming::from_headers(black_box(&request)),
                    tokio::time::Instant::now(),
                )
                .unwrap()
        })
    });
    g.bench_function("admit (no headers: the default budget)", |b| {
        b.iter(|| {
            policy
                .admit(Incoming::new(), tokio::time::Instant::now())
                .unwrap()
        })
    });
    let server = ServerScope::new();
    g.bench_function("admit_in (no headers, a child of a server's scope)", |b| {
        b.iter(|| {
            policy
                .admit_in(&server, Incoming::new(), tokio::time::Instant::now())
                .unwrap()
        })
    });
    g.bench_function("egress (call scope, both headers inserted)", |b| {
        b.iter(|| {
            let call = egress.call_scope(black_box(&root)).unwrap();
            let out = egress.outgoing(&call).unwrap();
            let mut h = HeaderMap::new();
            let t = out.grpc_timeout().unwrap();
            h.insert(GRPC_TIMEOUT, HeaderValue::try_from(t).unwrap());
            let sb = out.service_budget().unwrap().to_header_value();
            h.insert(SERVICE_BUDGET, HeaderValue::try_from(sb).unwrap());
            (call, h)
        })
    });
    g.finish();
    drop(root);
}

/// What one request costs through `Admit`: admission (no budget headers, the policy's
/// default budget), the handler run as the request scope's body, its response body read to
/// its end, next to the same handler called bare.
fn admit_layer(c: &mut Criterion) {
    use cancel_scope::integrations::tower::AdmitLayer;
    use http::Request;
    use tower_layer::Layer;

    use hello::{one, Hello};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ms = Duration::from_millis;
    let policy = EndpointPolicy::builder(ms(7_200_000))
        .default_budget(ms(3_600_000))
        .build();
    let mut g = c.benchmark_group("tower/admit");
    g.throughput(Throughput::Elements(1));
    g.bench_function("anchor: the handler called bare", |b| {
        let mut svc = Hello;
        b.iter(|| rt.block_on(one(&mut svc, Request::new(()))))
    });
    g.bench_function("Admit (root scope per request)", |b| {
        let mut svc = AdmitLayer::new(policy).layer(Hello);
        b.iter(|| rt.block_on(one(&mut svc, Request::new(()))))
    });
    g.bench_function("Admit under a ServerScope (child per request)", |b| {
        let server = ServerScope::new();
        let mut svc = AdmitLayer::new(policy).server(&server).layer(Hello);
        b.iter(|| rt.block_on(one(&mut svc, Request::new(()))))
    });
    g.finish();
}

criterion_group!(benches, codecs, per_request, admit_layer);
criterion_main!(benches);
