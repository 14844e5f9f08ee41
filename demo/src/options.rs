//! The command line: `--mode per-hop|scoped|both`, `--client-ms N`, `--inventory-ms N`.

use std::fmt;
use std::time::Duration;

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
    /// inventory's work runs in a detached task that nothing can stop (the seed's services).
    PerHop,
    /// The edge admits the client's budget, every hop runs its request in a scope, calls pass
    /// what is left on, and inventory's work runs inside its request's scope.
    Scoped,
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
        }
    }

    /// A heading for reports.
    pub(crate) const fn title(self) -> &'static str {
        match self {
            Mode::PerHop => "per-hop timeouts",
            Mode::Scoped => "scoped budgets",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The failure group's client budget unless `--client-ms` says otherwise (the seed's 100 ms).
pub const DEFAULT_CLIENT_BUDGET: Duration = Duration::from_millis(100);
/// Inventory's work unless `--inventory-ms` says otherwise (the seed's 350 ms).
pub const DEFAULT_INVENTORY_WORK: Duration = Duration::from_millis(350);
/// The success group's client budget (the seed's 2 s).
pub const SUCCESS_BUDGET: Duration = Duration::from_secs(2);
/// The largest value `--client-ms` and `--inventory-ms` take: the demonstration should finish
/// in seconds.
pub const MAX_MS: u64 = 60_000;

/// The usage text.
pub const USAGE: &str = "\
usage: cargo run --example service_chain -- [--mode per-hop|scoped|both] [--client-ms N] [--inventory-ms N]

  --mode MODE        which chain to run (default: both)
  --client-ms N      the failure group's client budget in ms, 1..=60000 (default: 100)
  --inventory-ms N   inventory's work per request in ms, 0..=60000 (default: 350)
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
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// One mode, or `None` for both (per-hop first).
    pub mode: Option<Mode>,
    /// The failure group's client budget.
    pub client_budget: Duration,
    /// How long inventory works on a quote.
    pub inventory_work: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: None,
            client_budget: DEFAULT_CLIENT_BUDGET,
            inventory_work: DEFAULT_INVENTORY_WORK,
        }
    }
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
    /// let args = ["--mode", "scoped", "--client-ms=80"].map(String::from);
    /// let Parsed::Run(o) = Options::parse(args)? else { unreachable!() };
    /// assert_eq!((o.mode, o.client_budget), (Some(Mode::Scoped), Duration::from_millis(80)));
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
                        _ => return Err(OptionsError::BadMode(value)),
                    }
                }
                "--client-ms" => o.client_budget = millis(option, &value, 1)?,
                _ => o.inventory_work = millis(option, &value, 0)?,
            }
        }
        Ok(Parsed::Run(o))
    }
}

/// A whole number of milliseconds in `min..=MAX_MS`.
fn millis(option: &'static str, value: &str, min: u64) -> Result<Duration, OptionsError> {
    let bad = || OptionsError::BadMillis {
        option,
        value: value.to_owned(),
        min,
    };
    // Digits only: no sign, no spaces, no units (u64's parser would take a leading `+`).
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match value.parse::<u64>() {
        Ok(n) if (min..=MAX_MS).contains(&n) => Ok(Duration::from_millis(n)),
        _ => Err(bad()),
    }
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
    /// `--mode` with something other than `per-hop`, `scoped` or `both`.
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
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionsError::Unknown(o) => write!(f, "unknown option {o:?}"),
            OptionsError::MissingValue(o) => write!(f, "{o} needs a value"),
            OptionsError::BadMode(m) => {
                write!(f, "--mode takes per-hop, scoped or both, not {m:?}")
            }
            OptionsError::BadMillis { option, value, min } => write!(
                f,
                "{option} takes a whole number of milliseconds from {min} to {MAX_MS}, not {value:?}"
            ),
        }
    }
}

impl std::error::Error for OptionsError {}
