//! Pins the auto traits of the scope's public types.

use cancel_scope::*;

fn send<T: Send>() {}
fn sync<T: Sync>() {}
fn unpin<T: Unpin>() {}
fn send_sync<T: Send + Sync>() {
    send::<T>();
    sync::<T>();
}

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Scope>();
    send_sync::<Cause>();
    send_sync::<Error>();
    send_sync::<Ticket>();
    send_sync::<Dispatched>();
    send_sync::<ChildSpec>();
    send_sync::<Effect>();
    send_sync::<EffectRecord>();
    send_sync::<Receipt>();
    send_sync::<Tethered<tokio::sync::OwnedSemaphorePermit>>();
    send_sync::<Tethered<u8>>();
    send_sync::<Report>();
    send_sync::<Lifecycle>();
    send_sync::<OnCancel>();
    send_sync::<Cancelled>();
    send_sync::<Quiesce>();
    send_sync::<JoinHandle<u8>>();
    send_sync::<budget::BudgetExhausted>();
    send_sync::<ChildBuilder<'static>>();
    send::<Run<std::future::Ready<u8>>>();
    send_sync::<Carried<std::future::Ready<u8>>>();
    #[cfg(feature = "stream")]
    send_sync::<RunStream<futures::stream::Empty<u8>>>();
}

#[test]
fn futures_are_unpin_where_expected() {
    unpin::<Scope>();
    unpin::<Cancelled>();
    unpin::<Quiesce>();
    unpin::<JoinHandle<u8>>();
    #[cfg(feature = "stream")]
    unpin::<RunStream<futures::stream::Empty<u8>>>();
}

#[test]
fn errors_are_std_errors() {
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    error::<Error>();
    error::<budget::BudgetExhausted>();
    error::<wire::GrpcTimeoutError>();
    error::<wire::ServiceBudgetError>();
    error::<wire::EnvoyTimeoutError>();
}
