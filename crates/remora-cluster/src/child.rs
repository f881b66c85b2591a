//! A program that runs its own cluster's daemons (see
//! [`ClusterConfig::this_program`](crate::ClusterConfig::this_program)).

/// Marks a child started by a cluster of [`ClusterConfig::this_program`].
pub(crate) const CHILD_ENV: &str = "REMORA_CLUSTER_CHILD";

#[derive(clap::Parser)]
struct ChildCli {
    #[command(subcommand)]
    cmd: ChildCmd,
}

#[derive(clap::Subcommand)]
enum ChildCmd {
    Manager(remora_manager::daemon::ManagerArgs),
    Memnode(remora_memnode::daemon::MemnodeArgs),
}

/// If this process was started as a daemon of a self-exec cluster, runs
/// that daemon and exits; otherwise returns at once. Call it first in `main`.
pub fn serve_if_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let cli = <ChildCli as clap::Parser>::parse();
    remora_daemon::init_logging(&std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
    let res = match cli.cmd {
        ChildCmd::Manager(a) => remora_manager::daemon::run(a).map_err(|e| e.to_string()),
        ChildCmd::Memnode(a) => remora_memnode::daemon::run(a).map_err(|e| e.to_string()),
    };
    match res {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
