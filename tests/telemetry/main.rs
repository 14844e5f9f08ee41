//! Telemetry: the metrics (names, labels, values) and the spans and events (names, fields,
//! levels) of admitted and refused requests, deadlines, clients gone, quarantines, unknown
//! effects, outgoing calls, retries and the application's own root scopes. A debugging recorder and a capturing subscriber are
//! installed on each test's thread (`capture`); time is virtual.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod time;
    pub mod tower;
}

mod admission;
mod calls;
mod capture;
mod outcomes;
mod recorder;
mod retry;
mod scopes;
mod shadow;
