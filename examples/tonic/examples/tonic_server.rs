//! A tonic server with request budgets: `AdmitLayer` under a `ServerScope` makes each call's
//! `grpc-timeout` the handler's scope (`Scope::current()`), a server-streaming method makes
//! each message in a child of the call's scope while the stream is sent, the crate's errors
//! become `tonic::Status`, and the server shuts down gracefully through
//! `serve_with_shutdown`. The code comes from `proto/quotes.proto` (protox, no `protoc`).
//!
//! ```sh
//! cargo run --example tonic_server               # serves on 127.0.0.1:50051 until Ctrl-C
//! cargo run --example tonic_server -- --self-test # calls itself, then shuts down (CI)
//! ```

use std::time::Duration;

use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::{EndpointPolicy, ServerScope};
use cancel_scope::Scope;
use cancel_scope_tonic_example::quotes::quotes_client::QuotesClient;
use cancel_scope_tonic_example::quotes::quotes_server::{Quotes, QuotesServer};
use cancel_scope_tonic_example::quotes::{QuoteReply, QuoteRequest, WatchRequest};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

struct Prices;

/// A price, made as a child of the current scope (a dependency call that takes 20 ms).
async fn price(item: u32) -> Result<QuoteReply, Status> {
    let call = Scope::current()
        .child()
        .min_useful(Duration::from_millis(20))
        .build()?;
    call.run(tokio::time::sleep(Duration::from_millis(20)))
        .await?;
    let left = Scope::current().remaining().unwrap_or_default();
    let left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
    Ok(QuoteReply {
        item,
        cents: item * 100 + 99,
        left_ms,
    })
}

#[tonic::async_trait]
impl Quotes for Prices {
    async fn quote(&self, request: Request<QuoteRequest>) -> Result<Response<QuoteReply>, Status> {
        price(request.into_inner().item).await.map(Response::new)
    }

    type WatchStream = ReceiverStream<Result<QuoteReply, Status>>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let count = request.into_inner().count;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        // A task of the call's scope: it makes each price while the stream is sent (the scope
        // stays open until the stream ends) and stops with the call's deadline.
        let producer = Scope::current().spawn(async move {
            for item in 1..=count {
                if tx.send(price(item).await).await.is_err() {
                    return;
                }
            }
        });
        let _producer = producer.map_err(Status::from)?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let self_test = std::env::args().any(|a| a == "--self-test");
    let policy = EndpointPolicy::builder(Duration::from_secs(2))
        .default_budget(Duration::from_secs(1))
        .reserve(Duration::from_millis(20))
        .build(); // ours comes before tonic's own timer
    let server = ServerScope::new();
    let admit = AdmitLayer::new(policy)
        .server(&server)
        .on_report(|admission, report| eprintln!("{}: {report}", admission.operation_id()));
    let listener = tokio::net::TcpListener::bind(if self_test {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:50051"
    })
    .await?;
    let url = format!("http://{}", listener.local_addr()?);
    eprintln!("serving on {url}");
    let serving = tonic::transport::Server::builder()
        .layer(admit)
        .add_service(QuotesServer::new(Prices))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            server.draining(),
        );
    let serving = tokio::spawn(serving);

    if self_test {
        let mut client = QuotesClient::connect(url).await?;
        let mut quote = Request::new(QuoteRequest { item: 7 });
        quote.set_timeout(Duration::from_millis(500));
        println!("quote: {:?}", client.quote(quote).await?.into_inner());
        let mut stream = client.watch(WatchRequest { count: 3 }).await?.into_inner();
        while let Some(reply) = stream.message().await? {
            println!("watch: {reply:?}");
        }
        // Too little budget for a price: refused before anything was started.
        let mut short = Request::new(QuoteRequest { item: 1 });
        short.set_timeout(Duration::from_millis(30));
        let refused = client.quote(short).await.unwrap_err();
        println!("30 ms: {:?} {}", refused.code(), refused.message());
        assert_eq!(refused.code(), tonic::Code::DeadlineExceeded);
    } else {
        tokio::signal::ctrl_c().await?;
    }
    let report = server.shutdown(Duration::from_secs(5)).await;
    println!("{report}");
    serving.await??;
    Ok(())
}
