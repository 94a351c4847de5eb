//! The daemon, CLI and client tests: each module starts real `pyvisor` processes (or an
//! in-process server) with real Python workers behind them, and talks to them over their
//! socket, HTTP or the CLI. One test binary, so that a clean build links it once.
//!
//! Run one area with `cargo test -p pyvisor --test suite cluster::`.

mod common;

mod access_control;
mod cli_exec;
mod cli_fork_and_files;
mod cli_manage;
mod cli_memory_eval;
mod cli_repl;
mod cli_replay;
mod cli_task;
mod client;
mod client_llm;
mod cluster;
mod cluster_client_llm;
mod cluster_directory;
mod cluster_failover;
mod cluster_forward;
mod cluster_haproxy;
mod cluster_memory;
mod cluster_store;
mod cluster_takeover;
mod config_check;
mod daemon_cli;
mod docs;
mod files_api;
mod http_api;
mod http_hardening;
mod limits_and_quotas;
mod loadtest;
mod memory_api;
mod rpc_socket;
mod serve_lifecycle;
