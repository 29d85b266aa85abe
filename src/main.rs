//! The `catalogsync` binary: parses the command line, starts logging and runs a subcommand.

use std::process::ExitCode;

use clap::Parser;

use catalogsync::config::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => match catalogsync::api::crds_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: failed to render CRDs: {err}");
                ExitCode::FAILURE
            }
        },
        Command::Shards(args) => match print_shards(&args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err:#}");
                ExitCode::FAILURE
            }
        },
        Command::Explain(args) => {
            // Warnings only, to stderr: stdout is the report.
            if let Err(err) = catalogsync::telemetry::init(catalogsync::config::LogFormat::Plain, "warn") {
                eprintln!("error: failed to set up logging: {err}");
                return ExitCode::from(2);
            }
            match catalogsync::explain::run(&args).await {
                Ok(report) => {
                    print!("{}", report.render(args.output));
                    match report.skr.as_ref().and_then(|skr| skr.error.as_ref()) {
                        Some(failure) => {
                            eprintln!("error: failed to read the SKR: {}: {}", failure.reason, failure.message);
                            ExitCode::from(catalogsync::explain::EXIT_SKR_FAILED)
                        }
                        None => ExitCode::SUCCESS,
                    }
                }
                Err(err) => {
                    eprintln!("error: {:#}", anyhow::Error::new(err));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            if let Err(err) = catalogsync::telemetry::init(args.log_format, &args.log_filter) {
                eprintln!("error: failed to set up logging: {err}");
                return ExitCode::from(2);
            }
            match catalogsync::app::run(*args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    let err = anyhow::Error::new(err);
                    eprintln!("error: {err:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn print_shards(args: &catalogsync::config::ShardsArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let client = kube::Client::try_default().await.context("failed to create a client from the kubeconfig")?;
    let table = catalogsync::sharding::table::read(&client, &args.lease_namespace, &args.kcp_namespace)
        .await
        .context("failed to read the Leases and Kymas")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&table)?);
    } else {
        print!("{}", catalogsync::sharding::table::render(&table));
    }
    Ok(())
}
