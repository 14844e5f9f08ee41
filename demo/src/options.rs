//! The command line: `--mode per-hop|scoped|both|shadow`, `--client-ms N`, `--inventory-ms N`,
//! `--time-scale N`.

use std::fmt;
use std::time::Duration;

use crate::chain::{FRONTEND_TIMEOUT, MIN_USEFUL, ORDERS_TIMEOUT, RESERVE, TRANSPORT_PAD};
use crate::run::{ARRIVAL, PATIENCE};

/// How the services of the chain treat time.
///
/// # Examples
///
/// ```
/// use cancel_scope_demo::Mode;
/// assert_eq!(Mode::Scoped.to_string(), "scoped");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Every hop has its own fixed timeout for its calls and ignores its caller's budget;
    /// inventory's work runs in a detached task that nothing can stop.
    PerHop,
    /// The edge admits the client's budget, every hop runs its request in a scope, calls pass
    /// what is left on, and inventory's work runs inside its request's scope.
    Scoped,
    /// The scoped chain with its policies in shadow mode: every budget decision is computed
    /// and recorded in each hop's report, none is enforced (the hard cap aside); then every
    /// hop's policy is switched to enforcing (`PolicyHandle::set`) without restarting its
    /// server, and the failure request is sent again.
    Shadow,
}

impl Mode {
    /// The name used on the command line and in request ids.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope_demo::Mode;
    /// assert_eq!(Mode::PerHop.name(), "per-hop");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Mode::PerHop => "per-hop",
            Mode::Scoped => "scoped",
            Mode::Shadow => "shadow",
        }
    }

    /// A heading for reports.
    pub(crate) const fn title(self) -> &'static str {
        match self {
            Mode::PerHop => "per-hop timeouts",
            Mode::Scoped => "scoped budgets",
            Mode::Shadow => "shadow mode",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The failure group's client budget unless `--client-ms` says otherwise.
pub const DEFAULT_CLIENT_BUDGET: Duration = Duration::from_millis(100);
/// Inventory's work unless `--inventory-ms` says otherwise.
pub const DEFAULT_INVENTORY_WORK: Duration = Duration::from_millis(350);
/// The success group's client budget.
pub const SUCCESS_BUDGET: Duration = Duration::from_secs(2);
/// The largest value `--client-ms` and `--inventory-ms` take: the demonstration should finish
/// in seconds.
pub const MAX_MS: u64 = 60_000;
/// The largest `--time-scale`.
pub const MAX_TIME_SCALE: u32 = 20;

/// The usage text.
pub const USAGE: &str = "\
usage: cargo run --example service_chain -- [--mode per-hop|scoped|both|shadow] [--client-ms N] [--inventory-ms N] [--time-scale N]

  --mode MODE        which chain to run (default: both, per-hop then scoped); shadow: the
                     scoped chain in shadow mode (every hop reports what its budget would
                     have done, nothing is enforced), then switched to enforcing without
                     restarting its servers
  --client-ms N      the failure group's client budget in ms, 1..=60000 (default: 100)
  --inventory-ms N   inventory's work per request in ms, 0..=60000 (default: 350)
  --time-scale N     multiplies every duration of the run, 1..=20 (default: 1): the client
                     budgets, the quote, the hop timeouts, the reserves and pads keep their
                     proportions with N times the margin, for a loaded machine
  -h, --help         this text

The report goes to stdout, the services' log lines to stderr. The exit status is 0 when every
claim of the report holds, 1 when one does not, 2 for bad options or servers that cannot start.";

/// What the demonstration runs.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope_demo::{Mode, Options};
///
/// let o = Options::default();
/// assert_eq!(o.modes(), [Mode::PerHop, Mode::Scoped]);
/// assert_eq!(o.client_budget, Duration::from_millis(100));
/// assert_eq!(o.inventory_work, Duration::from_millis(350));
/// assert_eq!(o.time_scale, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// One mode, or `None` for both (per-hop first).
    pub mode: Option<Mode>,
    /// The failure group's client budget, before the time scale.
    pub client_budget: Duration,
    /// How long inventory works on a quote, before the time scale.
    pub inventory_work: Duration,
    /// What every duration of the run is multiplied by (1 ..= [`MAX_TIME_SCALE`]).
    pub time_scale: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: None,
            client_budget: DEFAULT_CLIENT_BUDGET,
            inventory_work: DEFAULT_INVENTORY_WORK,
            time_scale: 1,
        }
    }
}

/// The durations of one run, on its time scale: every one of them is multiplied by it, so
/// that they keep their proportions (the client gives up long before the quote ends, the
/// quote ends long before a hop's fixed timeout) with that much more margin for a loaded
/// machine's delays, which do not grow with it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) scale: u32,
    /// The failure group's client budget.
    pub(crate) client: Duration,
    /// The success group's client budget.
    pub(crate) success: Duration,
    /// Inventory's quote.
    pub(crate) quote: Duration,
    /// Per-hop mode: frontend's fixed timeout, and orders'.
    pub(crate) frontend_timeout: Duration,
    pub(crate) orders_timeout: Duration,
    /// Scoped mode: each hop's reserve, each call's transport pad, the least useful budget.
    pub(crate) reserve: Duration,
    pub(crate) pad: Duration,
    pub(crate) min_useful: Duration,
    /// Scoped mode: the edge's maximum budget, and its budget for a caller that declares none.
    pub(crate) edge_max: Duration,
    pub(crate) edge_default: Duration,
    /// How long the run waits for a request on its way to a hop to arrive, and (past the
    /// budgets and the quote) for the services to be done with a request.
    pub(crate) arrival: Duration,
    pub(crate) patience: Duration,
}

/// The result of parsing the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Run with these options.
    Run(Options),
    /// Print the usage text.
    Help,
}

impl Options {
    /// `d` on this run's time scale.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope_demo::Options;
    /// let o = Options { time_scale: 5, ..Options::default() };
    /// assert_eq!(o.scaled(o.client_budget), Duration::from_millis(500));
    /// ```
    pub fn scaled(&self, d: Duration) -> Duration {
        d.saturating_mul(self.time_scale.max(1))
    }

    /// Every duration of the run, on its time scale.
    pub(crate) fn timing(&self) -> Timing {
        let s = |d| self.scaled(d);
        Timing {
            scale: self.time_scale.max(1),
            client: s(self.client_budget),
            success: s(SUCCESS_BUDGET),
            quote: s(self.inventory_work),
            frontend_timeout: s(FRONTEND_TIMEOUT),
            orders_timeout: s(ORDERS_TIMEOUT),
            reserve: s(RESERVE),
            pad: s(TRANSPORT_PAD),
            min_useful: s(MIN_USEFUL),
            edge_max: s(Duration::from_secs(5)),
            edge_default: s(Duration::from_secs(1)),
            arrival: s(ARRIVAL),
            patience: s(PATIENCE),
        }
    }

    /// The modes to run, in order.
    pub fn modes(&self) -> Vec<Mode> {
        match self.mode {
            Some(m) => vec![m],
            None => vec![Mode::PerHop, Mode::Scoped],
        }
    }

    /// Parses the arguments after the program name (`--opt value` or `--opt=value`).
    ///
    /// # Errors
    ///
    /// An [`OptionsError`] for an unknown option, a missing value, an unknown mode, or a
    /// number that is not a whole number of milliseconds in range.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope_demo::{Mode, Options, Parsed};
    ///
    /// let args = ["--mode", "scoped", "--client-ms=80", "--time-scale", "5"].map(String::from);
    /// let Parsed::Run(o) = Options::parse(args)? else { unreachable!() };
    /// assert_eq!((o.mode, o.client_budget), (Some(Mode::Scoped), Duration::from_millis(80)));
    /// assert_eq!(o.time_scale, 5);
    ///
    /// assert!(Options::parse(["--client-ms", "-5"].map(String::from)).is_err());
    /// assert_eq!(Options::parse(["-h".to_string()])?, Parsed::Help);
    /// # Ok::<(), cancel_scope_demo::OptionsError>(())
    /// ```
    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Parsed, OptionsError> {
        let mut o = Options::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
                _ => (arg, None),
            };
            let option = match name.as_str() {
                "-h" | "--help" => return Ok(Parsed::Help),
                "--mode" => "--mode",
                "--client-ms" => "--client-ms",
                "--inventory-ms" => "--inventory-ms",
                "--time-scale" => "--time-scale",
                _ => return Err(OptionsError::Unknown(name)),
            };
            let value = inline
                .or_else(|| args.next())
                .ok_or(OptionsError::MissingValue(option))?;
            match option {
                "--mode" => {
                    o.mode = match value.as_str() {
                        "per-hop" => Some(Mode::PerHop),
                        "scoped" => Some(Mode::Scoped),
                        "both" => None,
                        "shadow" => Some(Mode::Shadow),
                        _ => return Err(OptionsError::BadMode(value)),
                    }
                }
                "--client-ms" => o.client_budget = millis(option, &value, 1)?,
                "--time-scale" => o.time_scale = scale(&value)?,
                _ => o.inventory_work = millis(option, &value, 0)?,
            }
        }
        Ok(Parsed::Run(o))
    }
}

/// A whole number of milliseconds in `min..=MAX_MS`.
fn millis(option: &'static str, value: &str, min: u64) -> Result<Duration, OptionsError> {
    whole(value, min, MAX_MS)
        .map(Duration::from_millis)
        .ok_or_else(|| OptionsError::BadMillis {
            option,
            value: value.to_owned(),
            min,
        })
}

/// A whole number in `min..=max`, digits only: no sign, no spaces, no units (u64's parser
/// would take a leading `+`).
fn whole(value: &str, min: u64, max: u64) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
}

/// A time scale in `1..=MAX_TIME_SCALE`.
fn scale(value: &str) -> Result<u32, OptionsError> {
    whole(value, 1, MAX_TIME_SCALE.into())
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| OptionsError::BadTimeScale(value.to_owned()))
}

/// Why the command line was not understood. The `Display` text is for humans.
///
/// # Examples
///
/// ```
/// use cancel_scope_demo::{Options, OptionsError};
/// let err = Options::parse(["--mode".to_string(), "fast".to_string()]).unwrap_err();
/// assert_eq!(err, OptionsError::BadMode("fast".into()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OptionsError {
    /// An option this program does not have.
    Unknown(String),
    /// An option without its value.
    MissingValue(&'static str),
    /// `--mode` with something other than `per-hop`, `scoped`, `both` or `shadow`.
    BadMode(String),
    /// Not a whole number of milliseconds between `min` and [`MAX_MS`].
    BadMillis {
        /// The option.
        option: &'static str,
        /// What was given.
        value: String,
        /// The smallest value the option takes.
        min: u64,
    },
    /// `--time-scale` with something other than a whole number from 1 to
    /// [`MAX_TIME_SCALE`].
    BadTimeScale(String),
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionsError::Unknown(o) => write!(f, "unknown option {o:?}"),
            OptionsError::MissingValue(o) => write!(f, "{o} needs a value"),
            OptionsError::BadMode(m) => {
                write!(f, "--mode takes per-hop, scoped, both or shadow, not {m:?}")
            }
            OptionsError::BadMillis { option, value, min } => write!(
                f,
                "{option} takes a whole number of milliseconds from {min} to {MAX_MS}, not {value:?}"
            ),
            OptionsError::BadTimeScale(v) => write!(
                f,
                "--time-scale takes a whole number from 1 to {MAX_TIME_SCALE}, not {v:?}"
            ),
        }
    }
}

impl std::error::Error for OptionsError {}
