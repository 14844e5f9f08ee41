//! What the tests read telemetry with: `metrics-util`'s debugging recorder, installed on the
//! test's thread, and a `tracing` subscriber that keeps every span and event it sees.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// One span as the subscriber saw it: its name, its parent's name and its fields.
#[derive(Clone, Debug)]
pub struct SpanSeen {
    pub name: String,
    pub parent: Option<String>,
    pub fields: HashMap<String, String>,
}

impl SpanSeen {
    /// The field `name`, if it was recorded.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// One event: its level, the name of the span it is in and its fields (`message` too).
#[derive(Clone, Debug)]
pub struct EventSeen {
    pub level: Level,
    pub parent: Option<String>,
    pub fields: HashMap<String, String>,
}

impl EventSeen {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Seen {
    spans: Vec<SpanSeen>,
    /// The index in `spans` of each live span.
    ids: HashMap<u64, usize>,
    events: Vec<EventSeen>,
}

/// The spans and events seen.
#[derive(Clone, Default)]
pub struct Traces(Arc<Mutex<Seen>>);

impl Traces {
    /// Every span named `name`, in the order they were made.
    pub fn spans(&self, name: &str) -> Vec<SpanSeen> {
        let seen = self.0.lock().unwrap();
        seen.spans
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }

    /// The one span named `name`.
    pub fn span(&self, name: &str) -> SpanSeen {
        let spans = self.spans(name);
        assert_eq!(spans.len(), 1, "spans named {name}: {spans:#?}");
        spans.into_iter().next().unwrap()
    }

    /// Every event whose message is `message`.
    pub fn events(&self, message: &str) -> Vec<EventSeen> {
        let seen = self.0.lock().unwrap();
        seen.events
            .iter()
            .filter(|e| e.field("message") == Some(message))
            .cloned()
            .collect()
    }

    /// The one event whose message is `message`.
    pub fn event(&self, message: &str) -> EventSeen {
        let events = self.events(message);
        assert_eq!(events.len(), 1, "events {message:?}: {events:#?}");
        events.into_iter().next().unwrap()
    }
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

struct Capture(Traces);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.name().to_owned());
        let mut seen = (self.0).0.lock().unwrap();
        seen.spans.push(SpanSeen {
            name: attrs.metadata().name().to_owned(),
            parent,
            fields,
        });
        let at = seen.spans.len() - 1;
        seen.ids.insert(id.into_u64(), at);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut seen = (self.0).0.lock().unwrap();
        let Some(&at) = seen.ids.get(&id.into_u64()) else {
            return;
        };
        values.record(&mut Fields(&mut seen.spans[at].fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let parent = ctx.event_span(event).map(|s| s.name().to_owned());
        (self.0).0.lock().unwrap().events.push(EventSeen {
            level: *event.metadata().level(),
            parent,
            fields,
        });
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        (self.0).0.lock().unwrap().ids.remove(&id.into_u64());
    }
}

/// A subscriber that keeps every span and event (all levels), for `set_default`.
pub fn subscriber() -> (impl Subscriber + Send + Sync, Traces) {
    let traces = Traces::default();
    let subscriber = tracing_subscriber::registry().with(Capture(traces.clone()));
    (subscriber, traces)
}

/// One metric of a snapshot.
#[derive(Debug)]
pub struct MetricSeen {
    pub kind: MetricKind,
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub unit: Option<Unit>,
    pub value: DebugValue,
}

/// The metrics recorded since the last snapshot.
#[derive(Debug)]
pub struct Metrics(pub Vec<MetricSeen>);

impl Metrics {
    pub fn take(snapshotter: &Snapshotter) -> Self {
        Metrics(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, unit, _, value)| {
                    let (kind, key) = key.into_parts();
                    let (name, labels) = key.into_parts();
                    MetricSeen {
                        kind,
                        name: name.as_str().to_owned(),
                        labels: labels
                            .into_iter()
                            .map(|l| (l.key().to_owned(), l.value().to_owned()))
                            .collect(),
                        unit,
                        value,
                    }
                })
                .collect(),
        )
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a MetricSeen> + 'a {
        self.0.iter().filter(move |m| {
            m.name == name
                && labels.len() == m.labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| m.labels.iter().any(|(mk, mv)| mk == k && mv == v))
        })
    }

    /// The counter `name` with exactly `labels` (0 if it was never registered).
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.matching(name, labels)
            .map(|m| match m.value {
                DebugValue::Counter(n) => n,
                _ => panic!("{name} is not a counter"),
            })
            .sum()
    }

    /// The values of the histogram `name` with exactly `labels`.
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.matching(name, labels)
            .flat_map(|m| match &m.value {
                DebugValue::Histogram(v) => v.iter().map(|f| f.into_inner()).collect::<Vec<_>>(),
                _ => panic!("{name} is not a histogram"),
            })
            .collect()
    }

    /// Every label set of `name` that recorded something (a counter above 0, a histogram
    /// with values).
    pub fn label_sets(&self, name: &str) -> Vec<Vec<(String, String)>> {
        self.0
            .iter()
            .filter(|m| m.name == name)
            .filter(|m| match &m.value {
                DebugValue::Counter(n) => *n > 0,
                DebugValue::Histogram(v) => !v.is_empty(),
                DebugValue::Gauge(_) => true,
            })
            .map(|m| m.labels.clone())
            .collect()
    }
}

/// A debugging recorder and a capturing subscriber, installed on this thread for as long as
/// it lives (tests on the current-thread runtime: every task they spawn runs here).
pub struct Telemetry {
    pub snapshotter: Snapshotter,
    pub traces: Traces,
    // Dropped in this order: the guards before the recorder they point to.
    _metrics: metrics::LocalRecorderGuard<'static>,
    _tracing: tracing::subscriber::DefaultGuard,
}

impl Telemetry {
    /// Installs both. The recorder is leaked (a few bytes per test) so that its guard can
    /// live in the same value.
    pub fn install() -> Self {
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        let snapshotter = recorder.snapshotter();
        let metrics = metrics::set_default_local_recorder(recorder);
        let (subscriber, traces) = subscriber();
        let tracing = tracing::subscriber::set_default(subscriber);
        Telemetry {
            snapshotter,
            traces,
            _metrics: metrics,
            _tracing: tracing,
        }
    }

    /// The metrics recorded since the last call.
    pub fn metrics(&self) -> Metrics {
        Metrics::take(&self.snapshotter)
    }
}

/// The whole of a response body, as text.
pub async fn text<B>(mut body: B) -> String
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut out = Vec::new();
    while let Some(frame) = crate::support::tower::next_frame(&mut body).await {
        if let Ok(data) = frame.unwrap().into_data() {
            out.extend_from_slice(&data);
        }
    }
    String::from_utf8(out).unwrap()
}
