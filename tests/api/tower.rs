//! Pins the auto traits of the tower layers, their services, futures and bodies.

use std::convert::Infallible;

use cancel_scope::integrations::tower::{AdmitLayer, PropagateLayer};
use http::Response;

#[test]
fn auto_traits() {
    use cancel_scope::integrations::tower::{admit, propagate, Admit, Propagate};
    use cancel_scope::integrations::CallError;
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send<T: Send + 'static>() {}
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    type Fut = std::future::Ready<Result<Response<String>, Infallible>>;
    send_sync::<AdmitLayer>();
    send_sync::<PropagateLayer>();
    send_sync::<Admit<()>>();
    send_sync::<Propagate<()>>();
    send::<admit::future::ResponseFuture<Fut, String>>();
    send::<propagate::future::ResponseFuture<Fut>>();
    send_sync::<propagate::ResponseBody<String>>();
    error::<CallError>();
}

#[test]
fn admit_response_body_is_send_sync_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
    send_sync_unpin::<cancel_scope::integrations::tower::admit::ResponseBody<String>>();
}
