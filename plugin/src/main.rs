use clap::Parser;

fn main() -> anyhow::Result<()> {
    plugin::run(&plugin::Cli::parse())
}
