//! Command line and environment, resolved once into `Config`.
//!
//! Precedence lives here and nowhere else: a flag beats its `M0_*` variable,
//! which beats the default (clap's `env` does exactly that). A bad value in
//! either is a usage error naming the flag (exit 2).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::http::head::{Limits, MAX_HEADERS_CEILING};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "m0serve",
    version,
    about = "An HTTP/1.1 application server whose handlers are C-ABI plugins",
    after_help = "Exit codes: 0 stopped cleanly, 1 startup failure, 2 usage error, 78 configuration refused.\n\
                  Examples:\n  m0serve --plugin hello_c\n  m0serve --plugin wsgi --workers 2 myproject.wsgi:application"
)]
pub struct Cli {
    /// Plugin to serve: a path to a shared library, or a short name
    /// (hello_c, wsgi) looked up beside the binary and in M0_PLUGIN_PATH.
    #[arg(long, env = "M0_PLUGIN", value_name = "PLUGIN", required = true)]
    pub plugin: Option<String>,

    /// The plugin's own argument, handed to its init: wsgi takes an app
    /// (MODULE[:ATTR], or MODULE:factory(...)), embed a model folder
    /// (optional), pyembed a backend module; hello_c and hello_rs none.
    #[arg(value_name = "ARG")]
    pub arg: Option<String>,

    /// Address to listen on.
    #[arg(long, env = "M0_HOST", default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0 picks a free one and prints it).
    #[arg(long, env = "M0_PORT", default_value_t = 8000)]
    pub port: u16,

    /// Worker processes (1 to 512), or `auto`: one per usable CPU (what a
    /// Python app that holds the GIL needs to use every CPU).
    #[arg(long, env = "M0_WORKERS", default_value = "1", value_parser = parse_workers)]
    pub workers: u32,

    /// Pin each worker to this many CPUs of the server's own affinity mask,
    /// taken in turn (worker 0 the first N, worker 1 the next N, wrapping
    /// around): with `--workers 2 --cpu-affinity 1` on two CPUs each worker
    /// has a CPU of its own. For runtimes that start a thread per CPU they
    /// may run on (MAX, ONNX Runtime, OpenMP), so that workers stop
    /// splitting each CPU between their thread sets. 0 (the default) leaves
    /// the workers unpinned.
    #[arg(long, env = "M0_CPU_AFFINITY", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub cpu_affinity: u32,

    /// Start each worker by fork+exec of this binary instead of fork alone.
    #[arg(long, env = "M0_SPAWN_WORKERS", value_parser = parse_bool_flag, num_args = 0, default_missing_value = "true", default_value = "false")]
    pub spawn_workers: bool,

    /// Handler threads per worker (default: sized from the plugin's
    /// declaration, then adapted).
    #[arg(long, env = "M0_BLOCKING_THREADS", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub blocking_threads: Option<u32>,

    /// Never call the plugin on the thread that runs the event loop: neither
    /// inline calls (a plugin that declares M0_CAP_INLINE) nor loop calls
    /// (the loop's thread calling the plugin while the pool is idle, where
    /// that serves more); every call then goes through the handler pool.
    #[arg(long, env = "M0_NO_INLINE", value_parser = parse_bool_flag, num_args = 0, default_missing_value = "true", default_value = "false")]
    pub no_inline: bool,

    /// What the log shows: error, warn, info, or debug (info plus the
    /// server's tuning detail: pool sizes, hand-offs, per-worker statistics
    /// at exit).
    #[arg(long, env = "M0_LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub log_level: u32,

    /// Write a line per response to PATH (appended to, created if absent),
    /// or to standard output with `-`. Off by default.
    #[arg(long, env = "M0_ACCESS_LOG", value_name = "PATH|-")]
    pub access_log: Option<String>,

    /// Serve Prometheus metrics of the whole server on ADDR (host:port),
    /// path /metrics. Off by default.
    #[arg(long, env = "M0_METRICS", value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub metrics: Option<std::net::SocketAddr>,

    /// Peers whose proxy headers are believed (X-Forwarded-For,
    /// X-Forwarded-Proto, Forwarded): IPs separated by commas, `*` for any,
    /// empty for none. From them the client's address and scheme replace
    /// the connection's; from anyone else the headers change nothing.
    #[arg(long, env = "M0_FORWARDED_ALLOW_IPS", value_name = "IPS", default_value = "127.0.0.1,::1", value_parser = crate::http::forwarded::Trusted::parse)]
    pub forwarded_allow_ips: crate::http::forwarded::Trusted,

    /// Answer GET/HEAD PATH in the core, before any plugin: 200 while the
    /// worker serves, 503 once it drains (for load balancers and
    /// Kubernetes probes). Off by default.
    #[arg(long, env = "M0_HEALTH_PATH", value_name = "PATH", value_parser = parse_health_path)]
    pub health_path: Option<String>,

    /// Require `Authorization: Bearer KEY` before any plugin sees a request
    /// (401 otherwise). Repeatable. Visible to other users in `ps`: prefer
    /// --api-key-file or M0_API_KEY (one key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Vec<String>,

    /// A file of API keys, one a line (`#` comments); refused unless only
    /// its owner may read it (chmod 600).
    #[arg(long, env = "M0_API_KEY_FILE", value_name = "PATH")]
    pub api_key_file: Option<PathBuf>,

    /// A path answered without a key while keys are set (exact match,
    /// repeatable); the health path and the metrics listener always are.
    #[arg(long, value_name = "PATH", value_parser = parse_health_path)]
    pub api_key_open_path: Vec<String>,

    /// Let pages of ORIGIN (`https://app.example`, or `*` for any) call
    /// the server from a browser: the core answers preflights and adds
    /// Access-Control-Allow-Origin to their responses. Repeatable; off by
    /// default.
    #[arg(long, env = "M0_CORS_ALLOW_ORIGIN", value_name = "ORIGIN", value_delimiter = ',', value_parser = crate::http::cors::Origins::parse_one)]
    pub cors_allow_origin: Vec<String>,

    /// The access log's lines: `combined` (Apache's, then the duration in
    /// microseconds) or `json` (one object a line).
    #[arg(
        long,
        env = "M0_ACCESS_LOG_FORMAT",
        value_enum,
        default_value = "combined"
    )]
    pub access_log_format: AccessLogFormat,

    /// Call a plugin that declares M0_CAP_BATCH one request at a time
    /// instead of handing it the requests already queued in one batch.
    #[arg(long, env = "M0_NO_BATCH", value_parser = parse_bool_flag, num_args = 0, default_missing_value = "true", default_value = "false")]
    pub no_batch: bool,

    /// The most a batch that holds fewer requests than the previous call
    /// waits for the rest to arrive, in milliseconds (fractions allowed),
    /// and never more than an eighth of that call's time. 0 takes only what
    /// is queued.
    #[arg(long, env = "M0_BATCH_WAIT", value_name = "MS", value_parser = parse_millis, default_value = "2")]
    pub batch_wait: Duration,

    /// Turn accept sharing off: with several workers, the worker that
    /// accepts a connection keeps it instead of passing it to a less-loaded
    /// sibling (for measurement). The variable names the setting itself:
    /// M0_ACCEPT_SHARE=0 turns it off, 1 (the default) on.
    #[arg(long = "no-accept-share", env = "M0_ACCEPT_SHARE", value_parser = parse_accept_share, num_args = 0, default_missing_value = "false", default_value = "true")]
    pub accept_share: bool,

    /// Microseconds the event loop keeps polling, instead of sleeping, after
    /// its last event while it answers requests itself (inline or loop
    /// calls) and no handler thread is busy; 0 turns it off.
    #[arg(long, env = "M0_IDLE_SPIN_US", default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub idle_spin_us: u32,

    /// The idle spin stops while the loop's thread waited for its CPU this
    /// share of the time or more (percent, checked every 100 ms): a CPU
    /// that others want is not idle. 100 spins whatever the contention.
    #[arg(long, env = "M0_IDLE_SPIN_MAX_WAIT", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub idle_spin_max_wait: u32,

    /// Requests queued per worker before the server answers 503.
    #[arg(long, env = "M0_QUEUE_DEPTH", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue_depth: u32,

    /// Largest request body, with an optional k/m/g suffix (binary units).
    /// The body is held in memory until the request is dispatched, so the
    /// default bounds what one request may take: 100m passes an ordinary
    /// upload (photos, documents, a short video) without surprise.
    #[arg(long, env = "M0_MAX_BODY", default_value = "100m", value_parser = parse_size)]
    pub max_body: u64,

    /// Largest request line plus header fields, in bytes (k/m suffix).
    #[arg(long, env = "M0_MAX_HEADER_BYTES", default_value = "16k", value_parser = parse_size)]
    pub max_header_bytes: u64,

    /// Most header fields in a request.
    #[arg(long, env = "M0_MAX_HEADERS", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=MAX_HEADERS_CEILING as i64))]
    pub max_headers: u32,

    /// Longest request-target, in bytes (k suffix).
    #[arg(long, env = "M0_MAX_URI", default_value = "8k", value_parser = parse_size)]
    pub max_uri: u64,

    /// Seconds a client has to send a complete request head (408 after).
    #[arg(long, env = "M0_HEADER_TIMEOUT", default_value = "10", value_parser = parse_seconds)]
    pub header_timeout: Duration,

    /// Seconds a request body may stall between reads (408 after).
    #[arg(long, env = "M0_BODY_TIMEOUT", default_value = "30", value_parser = parse_seconds)]
    pub body_timeout: Duration,

    /// Bytes a second a request body must average once `--body-timeout`
    /// has passed: a body gets that many seconds plus one more for each
    /// BYTES it has sent, so a trickle that never stalls long enough for
    /// `--body-timeout` is still cut (408). 0 turns the rule off.
    #[arg(
        long,
        env = "M0_BODY_MIN_RATE",
        default_value_t = 500,
        value_name = "BYTES"
    )]
    pub body_min_rate: u64,

    /// Seconds an idle keep-alive connection stays open; also bounds a
    /// response the client stops reading.
    #[arg(long, env = "M0_IDLE_TIMEOUT", default_value = "60", value_parser = parse_seconds)]
    pub idle_timeout: Duration,

    /// Requests served on one connection before it is closed (0: no cap).
    #[arg(long, env = "M0_MAX_KEEPALIVE_REQUESTS", default_value_t = 1000)]
    pub max_keepalive_requests: u32,

    /// Seconds a stopping worker has to finish requests in flight.
    #[arg(long, env = "M0_GRACEFUL_TIMEOUT", default_value = "30", value_parser = parse_seconds)]
    pub graceful_timeout: Duration,

    /// Listen backlog.
    #[arg(long, env = "M0_BACKLOG", default_value_t = 1024)]
    pub backlog: u32,

    /// Directory put first on the application's import path.
    #[arg(long, env = "M0_APP_DIR", default_value = ".")]
    pub app_dir: PathBuf,

    /// Python virtual environment for the WSGI plugin (else VIRTUAL_ENV).
    #[arg(long, env = "M0_VENV")]
    pub venv: Option<PathBuf>,

    /// Print the configuration the server would run as JSON and exit with
    /// the code the server would exit with. Binds nothing.
    #[arg(long)]
    pub doctor: bool,
}

/// `--flag`, `--flag=true|false|1|0`, `M0_FLAG=1`.
/// A usage error as the user should read it: a bad value that came from an
/// `M0_*` variable (its flag is not on the command line) names the
/// variable, not the flag clap reports.
pub fn usage_message(e: &clap::Error, argv: &[String]) -> String {
    use clap::CommandFactory;
    use clap::error::{ContextKind, ContextValue};
    let text = e.to_string();
    let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg) else {
        return text;
    };
    let long = shown.split_whitespace().next().unwrap_or("");
    let on_command_line = argv
        .iter()
        .any(|a| a == long || a.starts_with(&format!("{long}=")));
    let env = Cli::command().get_arguments().find_map(|arg| {
        let named = arg
            .get_long()
            .is_some_and(|l| long.strip_prefix("--") == Some(l));
        named.then(|| arg.get_env().map(|v| v.to_string_lossy().into_owned()))?
    });
    match env {
        Some(var) if !on_command_line && std::env::var_os(&var).is_some() => text.replacen(
            &format!("for '{shown}'"),
            &format!("in {var} (the variable for {long})"),
            1,
        ),
        _ => text,
    }
}

/// The access log's line format (`--access-log-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessLogFormat {
    Combined,
    Json,
}

impl AccessLogFormat {
    pub fn name(self) -> &'static str {
        match self {
            AccessLogFormat::Combined => "combined",
            AccessLogFormat::Json => "json",
        }
    }
}

fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("expected an address and port such as 127.0.0.1:9100, got {s:?}"))
}

fn parse_health_path(s: &str) -> Result<String, String> {
    let ok = s.starts_with('/')
        && s.len() <= 1024
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "expected a path such as /healthz (from /, no query, no spaces), got {s:?}"
        ))
    }
}

fn parse_log_level(s: &str) -> Result<u32, String> {
    use m0serve_abi::{M0_LOG_DEBUG, M0_LOG_ERROR, M0_LOG_INFO, M0_LOG_WARN};
    match s.to_ascii_lowercase().as_str() {
        "error" => Ok(M0_LOG_ERROR),
        "warn" | "warning" => Ok(M0_LOG_WARN),
        "info" => Ok(M0_LOG_INFO),
        "debug" => Ok(M0_LOG_DEBUG),
        _ => Err(format!("expected error, warn, info or debug, got {s:?}")),
    }
}

/// `--workers`: a count, or `auto` for one worker per usable CPU (the
/// affinity mask and a cgroup quota counted, as `--doctor` shows them).
fn parse_workers(s: &str) -> Result<u32, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(crate::topology::usable_cpus().clamp(1, 512) as u32);
    }
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=512).contains(&n) => Ok(n),
        _ => Err(format!("expected 1 to 512 or auto, got {s:?}")),
    }
}

fn parse_bool_flag(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(format!("expected true or false (or 1/0), got {s:?}")),
    }
}

/// `M0_ACCEPT_SHARE`, which names the setting and not its flag
/// (`--no-accept-share` stands for false): `parse_bool_flag`'s values, and
/// empty leaves the default (on), as an empty `M0_FLAG` leaves the other
/// flags at theirs.
fn parse_accept_share(s: &str) -> Result<bool, String> {
    if s.is_empty() {
        Ok(true)
    } else {
        parse_bool_flag(s)
    }
}

/// `4096`, `16k`, `4m`, `1g` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1u64 << 20),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1u64 << 30),
        _ => (t, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("expected a size like 4096, 16k, 4m or 1g, got {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Seconds, fractions allowed (`0.5`); 0 is allowed and means "no limit"
/// for the idle and body timeouts.
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected seconds like 30 or 0.5, got {s:?}"))?;
    if !v.is_finite() || !(0.0..=86_400.0 * 365.0).contains(&v) {
        return Err(format!("expected seconds between 0 and a year, got {s:?}"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Milliseconds, fractions allowed (`0.5`), up to a second.
fn parse_millis(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected milliseconds like 2 or 0.5, got {s:?}"))?;
    if !v.is_finite() || !(0.0..=1000.0).contains(&v) {
        return Err(format!(
            "expected milliseconds between 0 and 1000, got {s:?}"
        ));
    }
    Ok(Duration::from_secs_f64(v / 1000.0))
}

/// Everything a worker needs, fixed at startup.
#[derive(Debug, Clone)]
pub struct Config {
    pub cli: Cli,
    pub limits: Limits,
    /// Loaded by the checks before the workers start (`auth.rs`).
    pub api_keys: Option<std::sync::Arc<crate::auth::ApiKeys>>,
}

impl Cli {
    /// What the API keys are loaded from (`auth::load`).
    pub fn key_sources(&self) -> crate::auth::KeySources<'_> {
        crate::auth::KeySources {
            keys: &self.api_key,
            file: self.api_key_file.as_deref(),
            open_paths: &self.api_key_open_path,
        }
    }
}

impl Config {
    pub fn from_cli(cli: Cli) -> Config {
        let limits = Limits {
            max_head_bytes: cli.max_header_bytes.min(u32::MAX as u64 / 2) as usize,
            max_headers: cli.max_headers as usize,
            max_uri: cli.max_uri.min(u32::MAX as u64 / 2) as usize,
            max_body: cli.max_body,
        };
        Config {
            cli,
            limits,
            api_keys: None,
        }
    }

    /// A timeout of 0 means "never".
    pub fn timeout(d: Duration) -> Option<Duration> {
        (!d.is_zero()).then_some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("16k").unwrap(), 16 * 1024);
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert!(parse_size("4x").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999g").is_err());
    }

    #[test]
    fn flag_beats_env_beats_default() {
        // clap reads the environment; keep this test's variable unique.
        let cli = Cli::try_parse_from(["m0serve", "--plugin", "x"]).unwrap();
        assert_eq!(cli.port, 8000);
        let cli = Cli::try_parse_from(["m0serve", "--plugin", "x", "--port", "9001"]).unwrap();
        assert_eq!(cli.port, 9001);
        assert!(Cli::try_parse_from(["m0serve", "--port", "80eighty"]).is_err());
        assert!(Cli::try_parse_from(["m0serve", "--workers", "0"]).is_err());
        assert!(Cli::try_parse_from(["m0serve", "--workers", "513"]).is_err());
        assert!(Cli::try_parse_from(["m0serve", "--workers", "some"]).is_err());
        let auto = Cli::try_parse_from(["m0serve", "--plugin", "x", "--workers", "auto"]).unwrap();
        assert_eq!(auto.workers as usize, crate::topology::usable_cpus());
    }

    #[test]
    fn accept_share_flag_beats_env_beats_default() {
        const VAR: &str = "M0_ACCEPT_SHARE";
        let parse = |extra: &[&str]| {
            let args = ["m0serve", "--plugin", "x"].iter().chain(extra);
            Cli::try_parse_from(args).unwrap().accept_share
        };
        let set = |value: Option<&str>| {
            // SAFETY: std serialises its own reads and writes of the
            // environment, and clap reads it through std; no test in this
            // binary reads the environment from C, and no other test reads
            // this variable (each value set here is a valid one, so a parse
            // racing with this test still succeeds).
            unsafe {
                match value {
                    Some(v) => std::env::set_var(VAR, v),
                    None => std::env::remove_var(VAR),
                }
            }
        };
        set(None);
        assert!(parse(&[]), "on by default");
        assert!(!parse(&["--no-accept-share"]));
        assert!(Cli::try_parse_from(["m0serve", "--no-accept-share=1"]).is_err());
        set(Some("0"));
        assert!(!parse(&[]), "{VAR}=0 turns it off");
        set(Some("off"));
        assert!(!parse(&[]));
        set(Some("1"));
        assert!(parse(&[]), "{VAR}=1 keeps it on");
        assert!(
            !parse(&["--no-accept-share"]),
            "the flag beats the variable"
        );
        set(Some(""));
        assert!(parse(&[]), "empty is the default");
        set(None);
        assert!(parse_accept_share("sometimes").is_err());
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_millis("0.5").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_millis("0").unwrap(), Duration::ZERO);
        assert!(parse_millis("1001").is_err());
        assert!(parse_millis("-1").is_err());
        assert!(parse_millis("soon").is_err());
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("soon").is_err());
    }
}
