//! Command line and environment, resolved once into `Config`.
//!
//! Precedence lives here and nowhere else: a flag beats its `M0_*` variable,
//! which beats the default (clap's `env` does exactly that). A bad value in
//! either is a usage error naming the flag (exit 2).

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser};

use crate::http::head::{Limits, MAX_HEADERS_CEILING};

pub mod bind;
mod help;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "m0serve",
    version,
    about = "An HTTP/1.1 application server whose handlers are C-ABI plugins",
    // `-h` is the page a user reads first: the common flags, one line
    // each; `--help` has every flag with its details and the long epilogue.
    after_help = help::AFTER_SHORT,
    after_long_help = help::AFTER_LONG,
    // `m0serve completions bash` needs no --plugin; with any flag before
    // it, "completions" is the plugin's ARG like any other word.
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Plugin to serve: hello_c, hello_rs, wsgi, embed, pyembed, or a path
    /// to a plugin's shared library.
    ///
    /// A short name is looked up as libNAME.so, libm0_NAME.so and NAME.so
    /// beside the binary, then in ../lib/m0serve beside it (where
    /// deploy/install puts the plugins), then in each directory of
    /// M0_PLUGIN_PATH.
    #[arg(long, env = "M0_PLUGIN", value_name = "PLUGIN", required = true)]
    pub plugin: Option<String>,

    /// The plugin's arguments: wsgi's app (MODULE:ATTR), embed's model
    /// folders, pyembed's backend module.
    ///
    /// Handed to the plugin's init, in order: wsgi takes an app
    /// (MODULE[:ATTR], or MODULE:factory(...)), embed one or more
    /// sentence-transformers model folders (DIR or NAME=DIR; optional: the
    /// default model's package in --venv), pyembed a backend module on
    /// --app-dir; hello_c and hello_rs none. A plugin built for ABI 1.5 or
    /// older takes one.
    #[arg(value_name = "ARG")]
    pub args: Vec<String>,

    /// The plugin's argument, as TEI spells it: the same as ARG.
    ///
    /// For `--model-id FOLDER` habits from text-embeddings-inference: the
    /// model folder embed serves. m0serve downloads nothing: a Hub id
    /// (sentence-transformers/all-MiniLM-L6-v2) is not a folder.
    #[arg(long, value_name = "MODEL", conflicts_with = "args")]
    pub model_id: Option<String>,

    /// Address to listen on.
    #[arg(
        value_name = "HOST",
        long,
        env = "M0_HOST",
        default_value = "127.0.0.1"
    )]
    pub host: String,

    /// Port to listen on (0 picks a free one and prints it).
    #[arg(value_name = "PORT", long, env = "M0_PORT", default_value_t = 8000)]
    pub port: u16,

    /// Address and port to listen on, HOST:PORT (gunicorn's and uvicorn's
    /// spelling of --host and --port).
    ///
    /// `[::1]:8000` for IPv6; a HOST alone keeps --port. Not with --host or
    /// --port on the same command line. A unix socket (unix:PATH) is
    /// refused: m0serve listens on TCP only.
    #[arg(short = 'b', long, env = "M0_BIND", value_name = "HOST:PORT", value_parser = bind::Bind::parse)]
    pub bind: Option<bind::Bind>,

    /// Worker processes (1 to 512), or `auto`: one per usable CPU.
    ///
    /// `auto` counts the affinity mask and a cgroup quota: what a Python
    /// app that holds the GIL needs to use every CPU.
    #[arg(value_name = "N", short = 'w', long, env = "M0_WORKERS", default_value = "1", value_parser = parse_workers)]
    pub workers: u32,

    /// Pin each worker to this many CPUs, in turn (0: unpinned).
    ///
    /// CPUs of the server's own affinity mask, taken in turn (worker 0 the
    /// first N, worker 1 the next N, wrapping around): with `--workers 2
    /// --cpu-affinity 1` on two CPUs each worker has a CPU of its own. For
    /// runtimes that start a thread per CPU they may run on (MAX, ONNX
    /// Runtime, OpenMP), so that workers stop splitting each CPU between
    /// their thread sets.
    #[arg(value_name = "N", long, env = "M0_CPU_AFFINITY", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub cpu_affinity: u32,

    /// Start each worker by fork+exec of this binary instead of fork alone.
    #[arg(long, env = "M0_SPAWN_WORKERS", value_parser = parse_bool_flag, num_args = 0, default_missing_value = "true", default_value = "false", hide_short_help = true)]
    pub spawn_workers: bool,

    /// Handler threads per worker (default: sized from the plugin's
    /// declaration, then adapted).
    #[arg(value_name = "N", long, env = "M0_BLOCKING_THREADS", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub blocking_threads: Option<u32>,

    /// Never call the plugin on the event loop's thread.
    ///
    /// Neither inline calls (a plugin that declares M0_CAP_INLINE) nor loop
    /// calls (the loop's thread calling the plugin while the pool is idle,
    /// where that serves more); every call then goes through the handler
    /// pool.
    #[arg(long, env = "M0_NO_INLINE", value_parser = parse_bool_flag, num_args = 0, default_missing_value = "true", default_value = "false", hide_short_help = true)]
    pub no_inline: bool,

    /// What the log shows: error, warn, info, or debug.
    ///
    /// debug is info plus the server's tuning detail: why the pool, the
    /// call path and batching are set as they are, hand-offs, per-worker
    /// statistics at exit.
    #[arg(value_name = "LEVEL", long, env = "M0_LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub log_level: u32,

    /// The server log's lines: `text` (gunicorn's [time] [pid] [LEVEL]) or
    /// `json` (one object a line).
    ///
    /// text: `[2026-12-05 11:30:00 +0000] [1234] [INFO] supervisor: ...`, in
    /// UTC. json: time, pid, level, process (supervisor, worker N), source
    /// ("plugin" for a plugin's line), message. The access log has its own
    /// --access-log-format.
    #[arg(
        value_name = "FORMAT",
        long,
        env = "M0_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Write a line per response to PATH, or to standard output with `-`.
    ///
    /// PATH is appended to, and created if absent. Off by default.
    #[arg(long, env = "M0_ACCESS_LOG", value_name = "PATH|-")]
    pub access_log: Option<String>,

    /// Serve Prometheus metrics of the whole server on ADDR (host:port),
    /// path /metrics. Off by default.
    #[arg(long, env = "M0_METRICS", value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub metrics: Option<std::net::SocketAddr>,

    /// Peers whose proxy headers are believed: IPs, `*` for any, empty for
    /// none.
    ///
    /// X-Forwarded-For, X-Forwarded-Proto and Forwarded, from peers listed
    /// with commas: from them the client's address and scheme replace the
    /// connection's; from anyone else the headers change nothing.
    #[arg(long, env = "M0_FORWARDED_ALLOW_IPS", value_name = "IPS", default_value = "127.0.0.1,::1", value_parser = crate::http::forwarded::Trusted::parse)]
    pub forwarded_allow_ips: crate::http::forwarded::Trusted,

    /// Answer GET/HEAD PATH in the core, for load balancers and probes.
    ///
    /// Answered before any plugin: 200 while the worker serves, 503 once
    /// it drains (for load balancers and Kubernetes probes). Off by
    /// default.
    #[arg(long, env = "M0_HEALTH_PATH", value_name = "PATH", value_parser = parse_health_path)]
    pub health_path: Option<String>,

    /// Require `Authorization: Bearer KEY` before any plugin sees a
    /// request.
    ///
    /// Requests without it get 401. Repeatable. Visible to other users in
    /// `ps`: prefer --api-key-file or M0_API_KEY (one key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Vec<String>,

    /// A file of API keys, one a line (chmod 600).
    ///
    /// `#` starts a comment; refused unless only its owner may read it.
    #[arg(long, env = "M0_API_KEY_FILE", value_name = "PATH")]
    pub api_key_file: Option<PathBuf>,

    /// A path answered without a key while keys are set (repeatable).
    ///
    /// An exact match; the health path and the metrics listener always
    /// are.
    #[arg(long, value_name = "PATH", value_parser = parse_health_path, hide_short_help = true)]
    pub api_key_open_path: Vec<String>,

    /// Let pages of ORIGIN call the server from a browser (CORS).
    ///
    /// `https://app.example`, or `*` for any: the core answers preflights
    /// and adds Access-Control-Allow-Origin to their responses. Repeatable;
    /// off by default.
    #[arg(long, env = "M0_CORS_ALLOW_ORIGIN", value_name = "ORIGIN", value_delimiter = ',', value_parser = crate::http::cors::Origins::parse_one)]
    pub cors_allow_origin: Vec<String>,

    /// The access log's lines: `combined` or `json`.
    ///
    /// combined: Apache's, then the duration in microseconds; json: one
    /// object a line.
    #[arg(
        value_name = "FORMAT",
        long,
        env = "M0_ACCESS_LOG_FORMAT",
        value_enum,
        default_value = "combined"
    )]
    pub access_log_format: AccessLogFormat,

    /// Call a batching plugin one request at a time.
    ///
    /// A plugin that declares M0_CAP_BATCH is otherwise handed the requests
    /// already queued in one batch.
    #[arg(long, env = "M0_NO_BATCH", value_parser = parse_bool_flag, num_args = 0, default_missing_value = "true", default_value = "false", hide_short_help = true)]
    pub no_batch: bool,

    /// The most a batch waits for more requests, in milliseconds.
    ///
    /// A batch that holds fewer requests than the previous call waits up to
    /// this (fractions allowed), and never more than an eighth of that
    /// call's time. 0 takes only what is queued.
    #[arg(long, env = "M0_BATCH_WAIT", value_name = "MS", value_parser = parse_millis, default_value = "2", hide_short_help = true)]
    pub batch_wait: Duration,

    /// Turn accept sharing off (for measurement).
    ///
    /// With several workers, the worker that accepts a connection keeps it
    /// instead of passing it to a less-loaded sibling. The variable names
    /// the setting itself: M0_ACCEPT_SHARE=0 turns it off, 1 (the default)
    /// on.
    #[arg(long = "no-accept-share", env = "M0_ACCEPT_SHARE", value_parser = parse_accept_share, num_args = 0, default_missing_value = "false", default_value = "true", hide_short_help = true)]
    pub accept_share: bool,

    /// Microseconds the event loop polls before it sleeps; 0 turns it off.
    ///
    /// The loop keeps polling, instead of sleeping, after its last event
    /// while it answers requests itself (inline or loop calls) and no
    /// handler thread is busy.
    #[arg(value_name = "US", long, env = "M0_IDLE_SPIN_US", default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=10_000), hide_short_help = true)]
    pub idle_spin_us: u32,

    /// The idle spin stops while the loop's thread waits for its CPU this
    /// share of the time (percent).
    ///
    /// Checked every 100 ms: a CPU that others want is not idle. 100 spins
    /// whatever the contention.
    #[arg(value_name = "PCT", long, env = "M0_IDLE_SPIN_MAX_WAIT", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100), hide_short_help = true)]
    pub idle_spin_max_wait: u32,

    /// Requests queued per worker before the server answers 503.
    #[arg(value_name = "N", long, env = "M0_QUEUE_DEPTH", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..), hide_short_help = true)]
    pub queue_depth: u32,

    /// Largest request body, with an optional k/m/g suffix.
    ///
    /// Binary units. The body is held in memory until the request is
    /// dispatched, so the default bounds what one request may take: 100m
    /// passes an ordinary upload (photos, documents, a short video) without
    /// surprise.
    #[arg(value_name = "SIZE", long, env = "M0_MAX_BODY", default_value = "100m", value_parser = parse_size)]
    pub max_body: u64,

    /// Largest request line plus header fields, in bytes (k/m suffix).
    #[arg(value_name = "SIZE", long, env = "M0_MAX_HEADER_BYTES", default_value = "16k", value_parser = parse_size, hide_short_help = true)]
    pub max_header_bytes: u64,

    /// Most header fields in a request.
    #[arg(value_name = "N", long, env = "M0_MAX_HEADERS", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=MAX_HEADERS_CEILING as i64), hide_short_help = true)]
    pub max_headers: u32,

    /// Longest request-target, in bytes (k suffix).
    #[arg(value_name = "SIZE", long, env = "M0_MAX_URI", default_value = "8k", value_parser = parse_size, hide_short_help = true)]
    pub max_uri: u64,

    /// Seconds a client has to send a complete request head (408 after).
    #[arg(value_name = "SECONDS", long, env = "M0_HEADER_TIMEOUT", default_value = "10", value_parser = parse_seconds, hide_short_help = true)]
    pub header_timeout: Duration,

    /// Seconds a request body may stall between reads (408 after).
    #[arg(value_name = "SECONDS", long, env = "M0_BODY_TIMEOUT", default_value = "30", value_parser = parse_seconds, hide_short_help = true)]
    pub body_timeout: Duration,

    /// Bytes a second a request body must average (0: no rule).
    ///
    /// Once `--body-timeout` has passed, a body gets that many seconds plus
    /// one more for each BYTES it has sent, so a trickle that never stalls
    /// long enough for `--body-timeout` is still cut (408).
    #[arg(
        long,
        env = "M0_BODY_MIN_RATE",
        default_value_t = 500,
        value_name = "BYTES",
        hide_short_help = true
    )]
    pub body_min_rate: u64,

    /// Seconds an idle keep-alive connection stays open.
    ///
    /// Also bounds a response the client stops reading.
    #[arg(value_name = "SECONDS", long, env = "M0_IDLE_TIMEOUT", default_value = "60", value_parser = parse_seconds, hide_short_help = true)]
    pub idle_timeout: Duration,

    /// Requests served on one connection before it is closed (0: no cap).
    #[arg(
        value_name = "N",
        long,
        env = "M0_MAX_KEEPALIVE_REQUESTS",
        default_value_t = 1000,
        hide_short_help = true
    )]
    pub max_keepalive_requests: u32,

    /// Seconds a stopping worker has to finish requests in flight.
    ///
    /// Past it the requests still in flight are cut off and the server
    /// exits 3.
    #[arg(value_name = "SECONDS", long, env = "M0_GRACEFUL_TIMEOUT", default_value = "30", value_parser = parse_seconds)]
    pub graceful_timeout: Duration,

    /// Listen backlog.
    #[arg(
        value_name = "N",
        long,
        env = "M0_BACKLOG",
        default_value_t = 1024,
        hide_short_help = true
    )]
    pub backlog: u32,

    /// Directory put first on the Python plugins' import path (wsgi,
    /// pyembed).
    #[arg(value_name = "DIR", long, env = "M0_APP_DIR", default_value = ".")]
    pub app_dir: PathBuf,

    /// Python virtual environment for the Python plugins: wsgi and pyembed
    /// import from it, embed finds its default model in it.
    ///
    /// Else VIRTUAL_ENV, else the Python the plugin was built with. A path
    /// that is not a venv (no pyvenv.cfg and bin/) is refused (exit 78).
    #[arg(value_name = "DIR", long, env = "M0_VENV")]
    pub venv: Option<PathBuf>,

    /// Print the configuration the server would run as JSON and exit with
    /// the code the server would exit with. Binds nothing.
    ///
    /// Indented on a terminal, one line when piped.
    #[arg(long)]
    pub doctor: bool,
}

/// What m0serve does instead of serving.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Command {
    /// Print a completion script for SHELL (bash, zsh, fish, elvish,
    /// powershell) on standard output.
    ///
    /// bash: `m0serve completions bash > ~/.local/share/bash-completion/completions/m0serve`;
    /// zsh: into a directory of $fpath as `_m0serve`; fish: into
    /// ~/.config/fish/completions/m0serve.fish. deploy/install puts all
    /// three under its prefix.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// A usage error as the user should read it: a bad value that came from an
/// `M0_*` variable (its flag is not on the command line) names the
/// variable, not the flag clap reports.
pub fn usage_message(e: &clap::Error, argv: &[String]) -> String {
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

/// The server log's line format (`--log-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
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

/// `--flag`, `--flag=true|false|1|0`, `M0_FLAG=1`.
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
    /// This process's command line and environment, resolved: what every
    /// process that reads them (the server, a spawned worker, the probe
    /// child) must call, so that they agree.
    pub fn from_env() -> Result<Cli, clap::Error> {
        Cli::resolve_from(std::env::args_os())
    }

    /// `args` (the program name first) and the environment, with the
    /// aliases resolved: `--model-id` into ARG, `--bind` into `--host` and
    /// `--port`. A `--bind` on the command line beside `--host` or `--port`
    /// is a usage error; from `M0_BIND` it gives way to them, as a variable
    /// gives way to a flag.
    pub fn resolve_from<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::parser::ValueSource;
        let mut cmd = Cli::command();
        let matches = cmd.try_get_matches_from_mut(args)?;
        let mut cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
        if let Some(model) = cli.model_id.take() {
            cli.args = vec![model];
        }
        let typed = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        if let Some(bind) = cli.bind.clone() {
            if typed("bind") && (typed("host") || typed("port")) {
                let message = "--bind sets the host and the port: pass --bind HOST:PORT, or \
                               --host and --port, not both\n";
                return Err(
                    clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, message)
                        .format(&mut cmd),
                );
            }
            if !typed("host") {
                cli.host = bind.host;
            }
            if let Some(port) = bind.port
                && !typed("port")
            {
                cli.port = port;
            }
        }
        Ok(cli)
    }

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
