//! The `anemone` binary: one module per verb; `anyhow` at this edge only.

mod cmd;
mod memory;

use clap::{ArgAction, Parser, Subcommand};
use std::process::ExitCode;

/// Transformer checkpoints to the Apple Neural Engine through Core ML, proven on any machine.
#[derive(Debug, Parser)]
#[command(name = "anemone", version, propagate_version = true)]
struct Cli {
    /// More log output on stderr: -v info, -vv debug, -vvv trace (RUST_LOG overrides).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Generate(cmd::generate::GenerateArgs),
    Convert(cmd::convert::ConvertArgs),
    Inspect(cmd::inspect::InspectArgs),
    Gate(cmd::gate::GateArgs),
    Clean(cmd::clean::CleanArgs),
    Bisect(cmd::bisect::BisectArgs),
    Doctor(cmd::doctor::DoctorArgs),
    #[command(hide = true)]
    BisectChild(cmd::bisect_child::BisectChildArgs),
    Embed(cmd::embed::EmbedArgs),
    Classify(cmd::embed::ClassifyArgs),
    Serve(cmd::serve::ServeArgs),
    Bench(cmd::bench::BenchArgs),
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    // `serve` handles SIGINT/SIGTERM itself (stop accepting, drain, exit 0) and stages nothing.
    if !matches!(cli.command, Command::Serve(_)) {
        clean_up_on_termination();
    }
    init_logging(cli.verbose);
    let result = match cli.command {
        Command::Generate(args) => cmd::generate::run(args),
        Command::Convert(args) => cmd::convert::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Gate(args) => cmd::gate::run(args),
        Command::Clean(args) => cmd::clean::run(args),
        Command::Bisect(args) => cmd::bisect::run(args),
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::BisectChild(args) => cmd::bisect_child::run(args),
        Command::Embed(args) => cmd::embed::run_embed(args),
        Command::Classify(args) => cmd::embed::run_classify(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Bench(args) => cmd::bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", render_error(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each stated once. Library errors name their cause in
/// their own message (so they read whole on their own) and also return it as `source()`; a cause
/// whose text is already in the line is not repeated.
fn render_error(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Rust ignores SIGPIPE, so `anemone inspect … | head` would panic on the closed pipe. A command
/// line tool ends quietly instead, like every other Unix filter. Outputs are still never left
/// half-written: bundles are built in a partial dir and swapped into place only when complete.
fn restore_default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// On SIGINT or SIGTERM, the partial outputs this process is writing are removed before it
/// exits with 128 + the signal's number (130, 143), as a shell reports it. SIGKILL cannot be
/// caught: its debris is removed by the next writer of the directory, or `anemone clean`.
fn clean_up_on_termination() {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("cannot install the SIGINT/SIGTERM handler: {e}");
                return;
            }
        };
        std::thread::spawn(move || {
            if let Some(signal) = signals.forever().next() {
                for path in anemone_mil::staging::remove_registered() {
                    eprintln!("interrupted: removed {}", path.display());
                }
                std::process::exit(128 + signal);
            }
        });
    }
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::render_error;

    /// A library error that states its cause in its message and also returns it as `source()`.
    #[derive(Debug)]
    struct Wrapped {
        source: std::io::Error,
    }

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "/out/m.bundle: {}", self.source)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(30);
        let io_text = io.to_string();
        let error = anyhow::Error::new(Wrapped { source: io }).context("writing the bundle");
        let line = render_error(&error);
        assert_eq!(
            line,
            format!("writing the bundle: /out/m.bundle: {io_text}")
        );
        assert_eq!(line.matches(&io_text).count(), 1, "{line}");
    }

    #[test]
    fn causes_not_in_the_message_are_kept_in_order() {
        let error = anyhow::anyhow!("innermost")
            .context("middle")
            .context("outer");
        assert_eq!(render_error(&error), "outer: middle: innermost");
    }
}
