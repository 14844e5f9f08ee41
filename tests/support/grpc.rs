//! A tiny gRPC service for the tests, written on `tonic::server::Grpc` with a UTF-8 string
//! codec, so that no protobuf compiler is needed: a unary method from a closure, served by a
//! tonic server on loopback, and a unary call through any gRPC client service.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut};
use http::uri::PathAndQuery;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// A codec for `String` messages, sent as their UTF-8 bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Utf8;

impl Codec for Utf8 {
    type Encode = String;
    type Decode = String;
    type Encoder = Utf8;
    type Decoder = Utf8;

    fn encoder(&mut self) -> Utf8 {
        Utf8
    }

    fn decoder(&mut self) -> Utf8 {
        Utf8
    }
}

impl Encoder for Utf8 {
    type Item = String;
    type Error = Status;

    fn encode(&mut self, item: String, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(item.as_bytes());
        Ok(())
    }
}

impl Decoder for Utf8 {
    type Item = String;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<String>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| Status::invalid_argument("not UTF-8"))
    }
}

/// The one method of [`UnaryFn`].
pub const METHOD: &str = "/test.Unary/Call";

/// A gRPC service (`test.Unary`) whose method [`METHOD`] runs `F` on the request's message.
#[derive(Clone)]
pub struct UnaryFn<F>(pub F);

impl<F> tonic::server::NamedService for UnaryFn<F> {
    const NAME: &'static str = "test.Unary";
}

type Answer = Pin<Box<dyn Future<Output = Result<tonic::Response<String>, Status>> + Send>>;

struct Call<F>(F);

impl<F, Fut> tonic::server::UnaryService<String> for Call<F>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<String, Status>> + Send + 'static,
{
    type Response = String;
    type Future = Answer;

    fn call(&mut self, request: tonic::Request<String>) -> Answer {
        let fut = (self.0)(request.into_inner());
        Box::pin(async move { fut.await.map(tonic::Response::new) })
    }
}

impl<F, Fut> tower::Service<http::Request<tonic::body::Body>> for UnaryFn<F>
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<String, Status>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let f = self.0.clone();
        Box::pin(async move { Ok(tonic::server::Grpc::new(Utf8).unary(Call(f), req).await) })
    }
}

/// One unary call of [`METHOD`] with `message` through any gRPC client service; the status
/// of a failed call keeps its metadata (the answer's headers or trailers).
pub async fn call<T>(client: T, message: &str) -> Result<String, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut grpc = tonic::client::Grpc::new(client);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.into().to_string()))?;
    let request = tonic::Request::new(message.to_owned());
    grpc.unary(request, PathAndQuery::from_static(METHOD), Utf8)
        .await
        .map(tonic::Response::into_inner)
}
