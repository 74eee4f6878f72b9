//! `cairn mcp`: the MCP server over stdio for local coding hosts, bridged to a running
//! cairn's `/mcp` with the token in `CAIRN_TOKEN` (see `crate::mcp_stdio`).

use std::collections::HashMap;
use std::process::ExitCode;

use crate::config::DEFAULT_BIND;

/// Serve MCP over stdio through a running cairn.
#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// Base URL of the cairn server.
    #[arg(long, env = "CAIRN_SERVER", default_value_t = format!("http://{DEFAULT_BIND}"))]
    server: String,
    /// Accept an admin token (refused by default: an agent needs `search`, and `ingest` to
    /// store).
    #[arg(long)]
    allow_admin: bool,
}

impl McpArgs {
    /// Runs the bridge until the host closes stdin.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let token = env
            .get("CAIRN_TOKEN")
            .map(|token| token.trim().to_owned())
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "set CAIRN_TOKEN to a cairn token with the `search` scope (create one with \
                     `cairn token create --name agent --scope search`)"
                )
            })?;
        crate::mcp_stdio::run(crate::mcp_stdio::Bridge {
            server: self.server,
            token,
            allow_admin: self.allow_admin,
        })
        .await?;
        Ok(ExitCode::SUCCESS)
    }
}
