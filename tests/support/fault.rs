//! A controllable fake downstream for fault-injection tests, driven on virtual time.
//!
//! [`Net`] is a deliberately fake *dependency* (a network plus the services behind it), not a
//! mock of the library: every call goes through the real `cancel_scope` API exactly as an
//! instrumented client would use it, so what the tests observe are the library's guarantees.
//! One call ([`Net::call`]) is:
//!
//! 1. **register** a child in the sender's scope ([`Scope::register`]: identity, generation,
//!    budget, effect kind) — if that fails nothing is sent;
//! 2. take a connection: a pool permit ([`Scope::acquire`], queueing pays from the budget), a
//!    tethered connection ([`Scope::tether`]) and the connect step (DNS + TCP: a delay, or stuck);
//! 3. **dispatch** the ticket (the generation compare-and-swap) and, in the same instant, send:
//!    the budget travels as a real `service-budget` header (what is left minus the transport
//!    pad, with the ticket's generation), which the downstream parses with the real codec and
//!    admits as its own root scope (`min(header, endpoint cap)`);
//! 4. wait for the reply while the sender's scope is live; a reply gives the child its receipt
//!    (`succeed`/`fail`), a cancel drops the child (the library's default receipt: `Cancelled`
//!    for read-only work, `EffectUnknown` for work that may have had an effect) and sends a
//!    cancel message to the downstream (unless that message is lost).
//!
//! Per call a [`Fault`] says what goes wrong: the downstream may answer after a delay, fail,
//! hang, ignore cancellation (both the client's driver and the server keep running), commit and
//! lose the response, only record the request, or run a [`Handler`] that calls further
//! downstream (a second hop, sent from the downstream's own admitted scope); the connect step
//! may be slow or stuck; the cancel message may be lost.
//!
//! The downstream records every request it received ([`Received`]): the generation and budget
//! it carried, the sender's scope state at that instant, the reserve line the sender promised
//! ([`Origin::line`]), the effect, whether it committed, and whether the caller ever got the
//! reply. [`Net::violations`] checks the six fault-injection invariants over that log and the
//! quiescence reports; [`Net::assert_invariants`] panics with every violation found.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cancel_scope::wire::ServiceBudget;
use cancel_scope::{Cause, ChildSpec, Dispatched, Effect, Error, Lifecycle, Report, Scope};
use tokio::sync::{oneshot, Notify, Semaphore};
use tokio::time::Instant;

/// A boxed `Send` future (handlers and recursive test drivers).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Server-side code for [`Behavior::Handle`]: runs under the downstream's admitted scope and
/// may call further downstream through [`Inbound::origin`].
pub type Handler = Arc<dyn Fn(Inbound) -> BoxFuture<Result<(), ()>> + Send + Sync>;

/// What the downstream does with a call it received.
#[derive(Clone)]
pub enum Behavior {
    /// Works for this long (stopping if cancelled or out of its own budget), commits, answers.
    Respond(Duration),
    /// Works for this long, then answers with an error (no effect).
    Fail(Duration),
    /// Never answers; stops only when cancelled (a cancel message or its own budget).
    Hang,
    /// Keeps running for this long whatever happens, then commits and answers; the client's
    /// driver ignores cancellation too (it keeps its ticket and its connection until then).
    IgnoreCancel(Duration),
    /// Works for this long, commits, and the response is lost on the way back.
    LoseResponse(Duration),
    /// Only records that it received the request, commits and answers at once.
    Record,
    /// Runs `Handler` under its admitted scope: a hop that may call further downstream.
    Handle(Handler),
}

impl fmt::Debug for Behavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Behavior::Respond(d) => f.debug_tuple("Respond").field(d).finish(),
            Behavior::Fail(d) => f.debug_tuple("Fail").field(d).finish(),
            Behavior::Hang => f.write_str("Hang"),
            Behavior::IgnoreCancel(d) => f.debug_tuple("IgnoreCancel").field(d).finish(),
            Behavior::LoseResponse(d) => f.debug_tuple("LoseResponse").field(d).finish(),
            Behavior::Record => f.write_str("Record"),
            Behavior::Handle(_) => f.write_str("Handle(..)"),
        }
    }
}

/// One call's faults: the downstream's behaviour, the connect step and the cancel message.
#[derive(Clone, Debug)]
pub struct Fault {
    /// What the downstream does.
    pub behavior: Behavior,
    /// How long DNS + connect take; `None`: stuck until the sender gives up.
    pub connect: Option<Duration>,
    /// The cancel message to the downstream is lost (it must stop on its own budget).
    pub lose_cancel: bool,
}

impl Fault {
    fn of(behavior: Behavior) -> Fault {
        Fault {
            behavior,
            connect: Some(Duration::ZERO),
            lose_cancel: false,
        }
    }
    /// Answers after `after`.
    pub fn respond(after: Duration) -> Fault {
        Fault::of(Behavior::Respond(after))
    }
    /// Fails after `after`.
    pub fn fail(after: Duration) -> Fault {
        Fault::of(Behavior::Fail(after))
    }
    /// Never answers.
    pub fn hang() -> Fault {
        Fault::of(Behavior::Hang)
    }
    /// Ignores cancellation, client and server, for `runs`.
    pub fn ignore_cancel(runs: Duration) -> Fault {
        Fault::of(Behavior::IgnoreCancel(runs))
    }
    /// Commits after `after`; the response is lost.
    pub fn lose_response(after: Duration) -> Fault {
        Fault::of(Behavior::LoseResponse(after))
    }
    /// Records the request and answers at once.
    pub fn record() -> Fault {
        Fault::of(Behavior::Record)
    }
    /// Runs `handler` (a hop that may call further downstream).
    pub fn handle(handler: Handler) -> Fault {
        Fault::of(Behavior::Handle(handler))
    }
    /// DNS/connect never completes.
    pub fn connect_stuck(mut self) -> Fault {
        self.connect = None;
        self
    }
    /// DNS/connect takes `d`.
    pub fn connect(mut self, d: Duration) -> Fault {
        self.connect = Some(d);
        self
    }
    /// The cancel message is lost.
    pub fn lose_cancel(mut self) -> Fault {
        self.lose_cancel = true;
        self
    }
}

/// Where a call comes from: the scope of the registered child's sender, the reserve line its
/// deadline must respect, the request it is sent on behalf of (a hop), and the tree it belongs
/// to (for receipt coverage per root).
#[derive(Clone, Debug)]
pub struct Origin {
    /// The scope the call's child is registered in.
    pub scope: Scope,
    /// The parent's reserve line: no deadline of this sender may be later.
    pub line: Option<Instant>,
    /// The received request whose handler sends this call (a second hop).
    pub parent: Option<u64>,
    /// Which root tree sends it (see [`Net::registered`]).
    pub tree: u64,
}

impl Origin {
    /// A root scope of tree `tree`: its line is its own deadline.
    pub fn root(scope: &Scope, tree: u64) -> Origin {
        Origin {
            scope: scope.clone(),
            line: scope.deadline(),
            parent: None,
            tree,
        }
    }

    /// `scope`, built from this origin's scope with `reserve` kept for the response: its line
    /// is the parent's deadline minus the reserve (the child's own line never exceeds ours).
    pub fn child(&self, scope: &Scope, reserve: Duration) -> Origin {
        let line = self
            .scope
            .deadline()
            .map(|d| d.checked_sub(reserve).unwrap_or(d));
        Origin {
            scope: scope.clone(),
            line: min_opt(line, self.line),
            parent: self.parent,
            tree: self.tree,
        }
    }
}

fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a hop's handler gets: its admitted scope as an [`Origin`] and the network.
#[derive(Clone, Debug)]
pub struct Inbound {
    /// The request's id in the log.
    pub id: u64,
    /// The downstream's admitted root scope, as the origin of further calls.
    pub origin: Origin,
    /// The network, to call further downstream.
    pub net: Net,
}

/// A reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The id of the request it answers.
    pub id: u64,
}

/// Why the downstream answered with an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// It failed (no effect).
    Failed,
    /// It stopped before committing (cancel message or its own budget), with its cause.
    Stopped(Cause),
    /// Admission refused the request: no budget left on arrival.
    Rejected,
}

/// Why a call ended without a reply.
#[derive(Clone, Debug)]
pub enum CallError {
    /// Registration was refused: nothing was sent.
    NotRegistered(Error),
    /// The dispatch compare-and-swap failed: nothing was sent.
    NotDispatched(Error),
    /// The sender's scope stopped the call (before sending, or while waiting for the reply).
    Stopped(Error),
    /// The downstream answered with an error.
    Downstream(Refusal),
}

impl CallError {
    /// Whether nothing was sent (refused before the dispatch).
    pub fn nothing_sent(&self) -> bool {
        matches!(
            self,
            CallError::NotRegistered(_) | CallError::NotDispatched(_)
        )
    }
}

/// What became of a received request on the server side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Still running.
    Running,
    /// Answered successfully (the caller may or may not have been there to read it).
    Answered,
    /// Answered with an error.
    Failed,
    /// Stopped before committing, at `at`, for `cause`.
    Stopped {
        /// When.
        at: Instant,
        /// Why (a cancel message, or its own deadline).
        cause: Cause,
    },
    /// Refused at admission: no budget left.
    Rejected,
    /// Committed; the response was lost.
    Lost,
}

/// One request the downstream received.
#[derive(Clone, Debug)]
pub struct Received {
    /// Its id (in order of arrival).
    pub id: u64,
    /// The service it was sent to.
    pub service: Arc<str>,
    /// The tree of the sender.
    pub tree: u64,
    /// The received request whose handler sent it, if it is a second hop.
    pub parent: Option<u64>,
    /// When it arrived (= when it was dispatched: sending is instantaneous).
    pub at: Instant,
    /// The `service-budget` header as sent.
    pub header: String,
    /// The remaining budget the header carried, as the downstream parsed it.
    pub carried: Duration,
    /// The cancel generation the header carried (the ticket's).
    pub generation: u64,
    /// The sender scope's generation when the request arrived.
    pub sender_generation: u64,
    /// Whether the sender's scope was cancelled when it arrived.
    pub sender_cancelled: bool,
    /// The sender scope's deadline.
    pub sender_deadline: Option<Instant>,
    /// The sender scope's lifecycle when it arrived (`Running`: it holds live work).
    pub sender_lifecycle: Lifecycle,
    /// Whether it came with a live dispatched ticket.
    pub ticket_live: bool,
    /// The reserve line the sender promised to respect.
    pub line: Option<Instant>,
    /// The effect the sender declared.
    pub effect: Effect,
    /// The id its effect is reconciled by (the idempotency key, or the side effect's id).
    pub effect_id: Option<Arc<str>>,
    /// The deadline of the downstream's admitted scope (`None`: rejected at admission).
    pub server_deadline: Option<Instant>,
    /// What the downstream did.
    pub outcome: Outcome,
    /// Whether the downstream committed an effect for it (a repeated idempotency key does not
    /// commit twice).
    pub committed: bool,
    /// What the caller read: `Some(true)` a success, `Some(false)` an error, `None` nothing.
    pub delivered: Option<bool>,
}

/// The fake network: a connection pool, the downstream services and their logs.
#[derive(Clone)]
pub struct Net {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Arc<Semaphore>,
    pool_size: usize,
    /// Subtracted from the budget on the way out (serialization, transport).
    pad: Duration,
    /// The downstream's endpoint cap for admitted budgets.
    cap: Duration,
    /// Client connections currently open.
    conns: AtomicUsize,
    /// Server tasks still running (including their quiescence).
    busy: AtomicUsize,
    idle: Notify,
    st: Mutex<St>,
}

#[derive(Default)]
struct St {
    received: Vec<Received>,
    scripts: HashMap<Arc<str>, VecDeque<Fault>>,
    defaults: HashMap<Arc<str>, Fault>,
    /// Registrations per tree (transport tickets and whatever [`Net::count`] adds).
    registered: HashMap<u64, u64>,
    /// Calls refused at registration or dispatch (nothing sent).
    refused: u64,
    /// Quiescence reports of the downstream's admitted scopes, with their tree.
    server_reports: Vec<(u64, Report)>,
    committed_keys: HashSet<Arc<str>>,
    /// Replies lost on the way back: kept so that the caller sees silence, not a reset.
    lost: Vec<oneshot::Sender<Result<Reply, Refusal>>>,
}

/// Server-side trees are numbered from here (a hop's tree is `SERVER_TREES + request id`).
pub const SERVER_TREES: u64 = 1 << 32;

/// A client connection, counted while open.
struct Conn(Arc<Inner>);

impl Drop for Conn {
    fn drop(&mut self) {
        self.0.conns.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sends the cancel message to the downstream when the caller stops waiting, unless disarmed
/// (a reply came) or the message is lost.
struct CancelLink {
    server: Option<Scope>,
}

impl Drop for CancelLink {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.cancel_with("cancel message");
        }
    }
}

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Net")
            .field("received", &self.inner.st.lock().unwrap().received.len())
            .finish_non_exhaustive()
    }
}

impl Net {
    /// A network with a pool of `pool_size` connections, no transport pad and a 30 s endpoint
    /// cap.
    pub fn new(pool_size: usize) -> Net {
        Net::with(pool_size, Duration::ZERO, Duration::from_secs(30))
    }

    /// A network with a transport pad and an endpoint cap.
    pub fn with(pool_size: usize, pad: Duration, cap: Duration) -> Net {
        Net {
            inner: Arc::new(Inner {
                pool: Arc::new(Semaphore::new(pool_size)),
                pool_size,
                pad,
                cap,
                conns: AtomicUsize::new(0),
                busy: AtomicUsize::new(0),
                idle: Notify::new(),
                st: Mutex::new(St::default()),
            }),
        }
    }

    /// The connection pool (tests may hold permits to make calls queue).
    pub fn pool(&self) -> &Arc<Semaphore> {
        &self.inner.pool
    }

    /// Faults for the next calls to `service`, in order; once they are used up, `default`
    /// (see [`set_default`](Self::set_default)), else an answer after 1 ms.
    pub fn script(&self, service: &str, faults: impl IntoIterator<Item = Fault>) {
        self.inner
            .st
            .lock()
            .unwrap()
            .scripts
            .entry(Arc::from(service))
            .or_default()
            .extend(faults);
    }

    /// The fault of every call to `service` that has no scripted one.
    pub fn set_default(&self, service: &str, fault: Fault) {
        self.inner
            .st
            .lock()
            .unwrap()
            .defaults
            .insert(Arc::from(service), fault);
    }

    fn next_fault(&self, service: &str) -> Fault {
        let mut st = self.inner.st.lock().unwrap();
        if let Some(f) = st.scripts.get_mut(service).and_then(VecDeque::pop_front) {
            return f;
        }
        st.defaults
            .get(service)
            .cloned()
            .unwrap_or_else(|| Fault::respond(Duration::from_millis(1)))
    }

    /// Calls `service` from `from` with its next scripted fault.
    ///
    /// # Errors
    ///
    /// See [`CallError`].
    pub async fn call(
        &self,
        from: &Origin,
        service: &str,
        spec: ChildSpec,
    ) -> Result<Reply, CallError> {
        let fault = self.next_fault(service);
        self.call_with(from, service, spec, fault).await
    }

    /// Calls `service` from `from` with `fault` (see the module docs for the steps).
    ///
    /// # Errors
    ///
    /// See [`CallError`].
    pub async fn call_with(
        &self,
        from: &Origin,
        service: &str,
        spec: ChildSpec,
        fault: Fault,
    ) -> Result<Reply, CallError> {
        let scope = &from.scope;
        // 1. Registration comes first: a child the scope does not know is never sent.
        let ticket = match scope.register(spec.clone()) {
            Ok(t) => t,
            Err(e) => {
                self.inner.st.lock().unwrap().refused += 1;
                return Err(CallError::NotRegistered(e));
            }
        };
        self.count(from.tree, 1);
        let generation = ticket.generation();
        // 2. A connection: pool permit, tethered connection, connect step — all paid from the
        // budget and stopped by the scope's cancel (the prepared ticket then records
        // `Cancelled`: nothing was sent).
        let inner = self.inner.clone();
        let connect = fault.connect;
        let connected = scope
            .run(async move {
                let permit = Scope::current().acquire(&inner.pool).await?;
                inner.conns.fetch_add(1, Ordering::SeqCst);
                let conn = Scope::current().tether(Conn(inner))?;
                match connect {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending::<()>().await,
                }
                Ok::<_, Error>((permit, conn))
            })
            .await;
        let (permit, conn) = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(e)) | Err(e) => return Err(CallError::Stopped(e)),
        };
        // 3. The dispatch CAS, and the send in the same instant.
        let dispatched = match ticket.dispatch() {
            Ok(d) => d,
            Err(e) => {
                self.inner.st.lock().unwrap().refused += 1;
                return Err(CallError::NotDispatched(e));
            }
        };
        let (id, rx, server) = self.deliver(from, service, &spec, generation, &dispatched, &fault);
        // 4. The reply.
        if let Behavior::IgnoreCancel(_) = fault.behavior {
            // A driver that does not check for cancellation: it keeps the child (and its
            // connection) until the downstream answers, whatever the scope says.
            let net = self.clone();
            let driver = tokio::spawn(async move {
                let reply = rx.await.unwrap_or(Err(Refusal::Failed));
                net.deliver_reply(id, dispatched, &reply);
                drop((permit, conn));
                reply
            });
            return match scope.run(driver).await {
                Ok(Ok(Ok(r))) => Ok(r),
                Ok(Ok(Err(refusal))) => Err(CallError::Downstream(refusal)),
                Ok(Err(_)) => Err(CallError::Downstream(Refusal::Failed)),
                Err(e) => Err(CallError::Stopped(e)),
            };
        }
        let mut link = CancelLink {
            server: server.filter(|_| !fault.lose_cancel),
        };
        let res = match scope.run(rx).await {
            Ok(Ok(reply)) => {
                link.server = None;
                self.deliver_reply(id, dispatched, &reply);
                reply.map_err(CallError::Downstream)
            }
            // The downstream dropped its reply channel: only on runtime shutdown.
            Ok(Err(_)) => Err(CallError::Downstream(Refusal::Failed)),
            // Stopped while waiting: the child is dropped and gets the library's default
            // receipt (`Cancelled`, or `EffectUnknown` for work that may have had an effect).
            Err(e) => {
                drop(dispatched);
                Err(CallError::Stopped(e))
            }
        };
        drop((link, permit, conn));
        res
    }

    /// The caller read `reply`: the child's receipt, and the log's `delivered`.
    fn deliver_reply(&self, id: u64, dispatched: Dispatched, reply: &Result<Reply, Refusal>) {
        match reply {
            Ok(_) => dispatched.succeed(),
            Err(_) => dispatched.fail(),
        }
        self.update(id, |r| r.delivered = Some(reply.is_ok()));
    }

    /// Sends the request: logs it with what the downstream sees, admits it and starts the
    /// server side. Synchronous: it happens in the instant of the dispatch.
    fn deliver(
        &self,
        from: &Origin,
        service: &str,
        spec: &ChildSpec,
        generation: u64,
        dispatched: &Dispatched,
        fault: &Fault,
    ) -> (
        u64,
        oneshot::Receiver<Result<Reply, Refusal>>,
        Option<Scope>,
    ) {
        let scope = &from.scope;
        let at = Instant::now();
        let left = scope
            .remaining()
            .map_or(self.inner.cap, |r| r.saturating_sub(self.inner.pad));
        let header = ServiceBudget::new(left)
            .with_generation(generation)
            .expect("generation fits the header")
            .to_header_value();
        // The downstream's side: parse with the real codec, admit min(header, cap).
        let parsed = ServiceBudget::parse(&header).expect("our own header parses");
        let admitted = parsed.remaining().min(self.inner.cap);
        let (tx, rx) = oneshot::channel();
        let mut st = self.inner.st.lock().unwrap();
        let id = st.received.len() as u64;
        let server = (!admitted.is_zero()).then(|| Scope::with_timeout(admitted));
        st.received.push(Received {
            id,
            service: Arc::from(service),
            tree: from.tree,
            parent: from.parent,
            at,
            header,
            carried: parsed.remaining(),
            generation: parsed.generation(),
            sender_generation: scope.generation(),
            sender_cancelled: scope.is_cancelled(),
            sender_deadline: scope.deadline(),
            sender_lifecycle: scope.lifecycle(),
            ticket_live: !dispatched.is_quarantined(),
            line: from.line,
            effect: spec.effect().clone(),
            effect_id: spec
                .effect_record()
                .map(|r| Arc::from(r.effect_id().to_owned())),
            server_deadline: server.as_ref().and_then(Scope::deadline),
            outcome: Outcome::Running,
            committed: false,
            delivered: None,
        });
        drop(st);
        match &server {
            None => {
                self.update(id, |r| r.outcome = Outcome::Rejected);
                let _ = tx.send(Err(Refusal::Rejected));
            }
            Some(s) if matches!(fault.behavior, Behavior::Record) => {
                self.commit(id);
                self.update(id, |r| r.outcome = Outcome::Answered);
                let _ = tx.send(Ok(Reply { id }));
                s.close();
            }
            Some(s) => {
                self.inner.busy.fetch_add(1, Ordering::SeqCst);
                let net = self.clone();
                let inbound = Inbound {
                    id,
                    origin: Origin {
                        scope: s.clone(),
                        line: s.deadline(),
                        parent: Some(id),
                        tree: SERVER_TREES + id,
                    },
                    net: self.clone(),
                };
                tokio::spawn(net.serve(inbound, fault.behavior.clone(), tx));
            }
        }
        (id, rx, server)
    }

    /// The downstream's side of one request, under its admitted scope.
    async fn serve(
        self,
        inbound: Inbound,
        behavior: Behavior,
        tx: oneshot::Sender<Result<Reply, Refusal>>,
    ) {
        let id = inbound.id;
        let scope = inbound.origin.scope.clone();
        let stopped = |e: Error| {
            let cause = e
                .cause()
                .cloned()
                .unwrap_or(Cause::Cancelled { reason: None });
            (
                Outcome::Stopped {
                    at: Instant::now(),
                    cause: cause.clone(),
                },
                Err(Refusal::Stopped(cause)),
            )
        };
        let (outcome, reply) = match behavior {
            Behavior::Respond(d) | Behavior::LoseResponse(d) => {
                match scope.run(tokio::time::sleep(d)).await {
                    Ok(()) => {
                        self.commit(id);
                        if let Behavior::LoseResponse(_) = behavior {
                            (Outcome::Lost, Ok(Reply { id }))
                        } else {
                            (Outcome::Answered, Ok(Reply { id }))
                        }
                    }
                    Err(e) => stopped(e),
                }
            }
            Behavior::Fail(d) => match scope.run(tokio::time::sleep(d)).await {
                Ok(()) => (Outcome::Failed, Err(Refusal::Failed)),
                Err(e) => stopped(e),
            },
            Behavior::Hang => match scope.run(std::future::pending::<()>()).await {
                Ok(()) => unreachable!("pending never completes"),
                Err(e) => stopped(e),
            },
            Behavior::IgnoreCancel(d) => {
                tokio::time::sleep(d).await;
                self.commit(id);
                (Outcome::Answered, Ok(Reply { id }))
            }
            Behavior::Record => unreachable!("answered at delivery"),
            Behavior::Handle(h) => match scope.run(h(inbound.clone())).await {
                Ok(Ok(())) => {
                    self.commit(id);
                    (Outcome::Answered, Ok(Reply { id }))
                }
                Ok(Err(())) => (Outcome::Failed, Err(Refusal::Failed)),
                Err(e) => stopped(e),
            },
        };
        let lost = outcome == Outcome::Lost;
        self.update(id, |r| r.outcome = outcome);
        if lost {
            self.inner.st.lock().unwrap().lost.push(tx);
        } else {
            let _ = tx.send(reply);
        }
        scope.close();
        let report = scope.quiesce().await;
        self.inner
            .st
            .lock()
            .unwrap()
            .server_reports
            .push((SERVER_TREES + id, report));
        self.inner.busy.fetch_sub(1, Ordering::SeqCst);
        self.inner.idle.notify_waiters();
    }

    /// Commits request `id`'s effect (once per idempotency key).
    fn commit(&self, id: u64) {
        let mut st = self.inner.st.lock().unwrap();
        let r = &st.received[id as usize];
        if !r.effect.may_have_effect() {
            return;
        }
        let fresh = match &r.effect {
            Effect::Idempotent { key } => {
                let key = key.clone();
                st.committed_keys.insert(key)
            }
            _ => true,
        };
        st.received[id as usize].committed = fresh;
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut Received)) {
        f(&mut self.inner.st.lock().unwrap().received[id as usize]);
    }

    /// Counts `n` registrations of tree `tree` made outside the transport (spawned tasks,
    /// retry attempts, fan-out branches), for [`registered`](Self::registered).
    pub fn count(&self, tree: u64, n: u64) {
        *self
            .inner
            .st
            .lock()
            .unwrap()
            .registered
            .entry(tree)
            .or_default() += n;
    }

    /// Registrations counted for tree `tree`.
    pub fn registered(&self, tree: u64) -> u64 {
        self.inner
            .st
            .lock()
            .unwrap()
            .registered
            .get(&tree)
            .copied()
            .unwrap_or(0)
    }

    /// Calls refused before sending (registration or dispatch failed).
    pub fn refused(&self) -> u64 {
        self.inner.st.lock().unwrap().refused
    }

    /// Every request received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.inner.st.lock().unwrap().received.clone()
    }

    /// Requests received by `service`.
    pub fn received_by(&self, service: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| &*r.service == service)
            .collect()
    }

    /// Client connections open now.
    pub fn open_connections(&self) -> usize {
        self.inner.conns.load(Ordering::SeqCst)
    }

    /// Pool permits held now.
    pub fn permits_out(&self) -> usize {
        self.inner.pool_size - self.inner.pool.available_permits()
    }

    /// Waits until every server task (and its admitted scope's quiescence) has ended.
    pub async fn settle(&self) {
        loop {
            let idle = self.inner.idle.notified();
            if self.inner.busy.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The reports of the downstream's admitted scopes, with their trees.
    pub fn server_reports(&self) -> Vec<(u64, Report)> {
        self.inner.st.lock().unwrap().server_reports.clone()
    }

    /// Checks the six fault-injection invariants over the log, given the quiescence report of each
    /// client tree (`(tree, report)`); call it after every client tree quiesced and
    /// [`settle`](Self::settle) returned. Returns one line per violation.
    ///
    /// 1. unregistered children sent = 0 (and every registration of a tree has a receipt);
    /// 2. no sender's deadline, nor the budget it sent, is later than its parent's reserve line;
    /// 3. budgets never grew across hops (a hop's admitted deadline is at most what it was
    ///    sent, and what it sends on is at most that);
    /// 4. no call was created under an old generation (nor from a cancelled scope, nor at or
    ///    after the sender's deadline);
    /// 5. unknown effects are not counted as zero: every effectful request whose reply the
    ///    caller never read is listed for reconciliation in a report;
    /// 6. permits and connections outstanding after quiescence = 0.
    pub fn violations(&self, trees: &[(u64, &Report)]) -> Vec<String> {
        let st = self.inner.st.lock().unwrap();
        let mut v = Vec::new();
        let reports: Vec<(u64, &Report)> = trees
            .iter()
            .copied()
            .chain(st.server_reports.iter().map(|(t, r)| (*t, r)))
            .collect();
        // 1.
        for r in &st.received {
            if !r.ticket_live || r.sender_lifecycle != Lifecycle::Running {
                v.push(format!(
                    "1: request {} sent without a live registered child (ticket live {}, sender {:?})",
                    r.id, r.ticket_live, r.sender_lifecycle
                ));
            }
        }
        for (tree, report) in &reports {
            let n = st.registered.get(tree).copied().unwrap_or(0);
            if report.total() != n {
                v.push(format!(
                    "1: tree {tree}: {n} registrations but {} receipts",
                    report.total()
                ));
            }
        }
        let by_id = |id: u64| &st.received[id as usize];
        for r in &st.received {
            let sent_until = r.at + r.carried;
            // 2.
            if let Some(line) = r.line {
                if r.sender_deadline.is_some_and(|d| d > line) {
                    v.push(format!(
                        "2: request {}: sender deadline {:?} after its reserve line {:?}",
                        r.id, r.sender_deadline, line
                    ));
                }
                if sent_until > line {
                    v.push(format!(
                        "2: request {}: sent budget ends {:?} after the reserve line",
                        r.id,
                        sent_until - line
                    ));
                }
            }
            // 3.
            if r.sender_deadline
                .is_some_and(|d| r.carried > d.saturating_duration_since(r.at))
            {
                v.push(format!(
                    "3: request {} carried more than its sender had",
                    r.id
                ));
            }
            if r.server_deadline.is_some_and(|d| d > sent_until) {
                v.push(format!(
                    "3: request {}: admitted deadline later than what was sent",
                    r.id
                ));
            }
            if let Some(p) = r.parent.map(by_id) {
                let parent_until = p.server_deadline.unwrap_or(p.at);
                if sent_until > parent_until || sent_until > p.at + p.carried {
                    v.push(format!(
                        "3: request {} (a hop of {}) carries a budget past its parent's",
                        r.id, p.id
                    ));
                }
            }
            // 4.
            if r.generation != r.sender_generation || r.sender_cancelled {
                v.push(format!(
                    "4: request {} created under generation {} (sender at {}, cancelled {})",
                    r.id, r.generation, r.sender_generation, r.sender_cancelled
                ));
            }
            if r.sender_deadline.is_some_and(|d| r.at >= d) {
                v.push(format!(
                    "4: request {} sent at or after its sender's deadline ({:?} late)",
                    r.id,
                    r.at - r.sender_deadline.unwrap()
                ));
            }
        }
        // 5.
        let pending: HashSet<&str> = reports
            .iter()
            .flat_map(|(_, rep)| rep.pending_effects().iter().map(|e| e.effect_id()))
            .collect();
        for r in &st.received {
            if r.effect.may_have_effect() && r.delivered.is_none() {
                let listed = r.effect_id.as_deref().is_some_and(|e| pending.contains(e));
                if !listed {
                    v.push(format!(
                        "5: request {} (effect {:?}, outcome {:?}, committed {}) has no reply \
                         and is not listed for reconciliation",
                        r.id, r.effect_id, r.outcome, r.committed
                    ));
                }
            }
        }
        for (tree, report) in &reports {
            if !report.pending_effects().is_empty()
                && report.state() != Lifecycle::NeedsReconciliation
            {
                v.push(format!(
                    "5: tree {tree} has pending effects but ended {:?}",
                    report.state()
                ));
            }
        }
        // 6.
        let permits = self.permits_out();
        let conns = self.open_connections();
        if permits != 0 || conns != 0 {
            v.push(format!(
                "6: {permits} permits and {conns} connections outstanding after quiescence"
            ));
        }
        v
    }

    /// Panics with every violation of [`violations`](Self::violations) and the log.
    #[track_caller]
    pub fn assert_invariants(&self, trees: &[(u64, &Report)]) {
        let v = self.violations(trees);
        if !v.is_empty() {
            panic!(
                "{} invariant violation(s):\n  {}\nlog:\n{:#?}",
                v.len(),
                v.join("\n  "),
                self.received()
            );
        }
    }
}

/// Quiesces `root` (after closing it unless it is cancelled) and the downstream, then checks
/// the invariants for tree `tree`; returns the root's report.
pub async fn quiesce_and_check(net: &Net, root: &Scope, tree: u64) -> Report {
    if !root.is_cancelled() {
        root.close();
    }
    let report = root.quiesce().await;
    net.settle().await;
    net.assert_invariants(&[(tree, &report)]);
    assert_eq!(root.quiesce().await, report, "the report is stable");
    report
}
