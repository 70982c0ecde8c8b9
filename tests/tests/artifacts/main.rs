//! What ships besides the binary, used as written: the README's commands, the deploy/
//! manifests, the dashboards and alert rules, the docs' promises and their links. One test
//! binary, a module per artifact.

mod build_scripts;
mod dashboards;
mod deploy;
mod dev_command;
mod docs;
mod links;
