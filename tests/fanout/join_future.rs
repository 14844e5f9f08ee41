//! `FanOut::join` returns the named future `fanout::Join`: a struct can hold it and a
//! function can return it; it does nothing until polled, and dropped it leaves no branch
//! running or without its receipt.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use cancel_scope::fanout::{FanOut, FanOutError, Join, Joined, Required};
use cancel_scope::Scope;

use crate::support::time::ms;

/// A future of the caller's own that holds a fan-out in progress as a field.
struct Page<'s, F> {
    join: F,
    price: Option<Required<u32>>,
    _scope: std::marker::PhantomData<&'s Scope>,
}

impl<F> Future for Page<'_, F>
where
    F: Future<Output = Result<Joined, FanOutError>> + Unpin,
{
    type Output = u32;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
        let mut joined = std::task::ready!(Pin::new(&mut self.join).poll(cx)).unwrap();
        let price = self.price.take().expect("polled after completion");
        Poll::Ready(joined.required(price))
    }
}

fn page(scope: &Scope) -> Page<'_, Join<'_>> {
    let mut fan = FanOut::new(scope);
    let price = fan.required("price", |_| async {
        tokio::time::sleep(ms(10)).await;
        Ok::<_, std::io::Error>(1999_u32)
    });
    Page {
        join: fan.join(),
        price: Some(price),
        _scope: std::marker::PhantomData,
    }
}

#[tokio::test(start_paused = true)]
async fn the_join_future_can_be_named_in_a_struct_field() {
    let request = Scope::with_timeout(ms(500));
    assert_eq!(page(&request).await, 1999);
    assert_eq!(request.remaining(), Some(ms(490)));
}

#[tokio::test(start_paused = true)]
async fn the_join_starts_nothing_until_polled() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request);
    let _price = fan.required("price", |_| async { Ok::<_, std::io::Error>(1_u32) });
    let join = fan.join();
    assert_eq!(
        request.__live_children(),
        0,
        "built the fan-out's scope before a poll"
    );
    drop(join);
    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.total(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_join_cancels_its_branches_and_each_has_its_receipt() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request);
    for name in ["price", "stock"] {
        let _ = fan.required(name, |_| async {
            tokio::time::sleep(ms(300)).await;
            Ok::<_, std::io::Error>(())
        });
    }
    let cut = tokio::time::timeout(ms(100), fan.join()).await;
    assert!(cut.is_err());
    request.close();
    let report = request.quiesce().await;
    assert_eq!((report.cancelled(), report.total()), (2, 2));
    assert_eq!(
        request.remaining(),
        Some(ms(400)),
        "the branches stopped at the drop, not at their end"
    );
}
