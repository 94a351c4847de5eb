//! `pyvisor config check`: load the configuration as the daemon would, and print the
//! effective settings or the error that stops them.

use std::path::PathBuf;

use clap::Subcommand;
use pyvisor::config::Settings;

use super::EXIT_USAGE;

/// Subcommands of `pyvisor config`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a config file (else the one the search order finds) and print the effective
    /// configuration, environment overrides included.
    Check {
        /// The file to check; without it, the search order of `pyvisor serve` applies.
        path: Option<PathBuf>,
    },
}

pub fn run(command: ConfigCommand) -> u8 {
    match command {
        ConfigCommand::Check { path } => check(path),
    }
}

fn check(path: Option<PathBuf>) -> u8 {
    let loaded = match Settings::load(path.as_deref()) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("pyvisor: {err}");
            return EXIT_USAGE;
        }
    };
    let text = match toml::to_string(&loaded.settings) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("pyvisor: failed to print the configuration: {err}");
            return EXIT_USAGE;
        }
    };
    match &loaded.source {
        Some(source) => println!("# source: {}", source.display()),
        None => println!("# source: built-in defaults"),
    }
    for var in &loaded.overrides {
        println!("# override: {var}");
    }
    print!("{text}");
    0
}
