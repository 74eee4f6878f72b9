//! `cairn auth check TOKEN`: what cairn makes of an OAuth access token, with the `[oauth]`
//! settings of the configuration file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

/// OAuth sign-in: check what cairn makes of a token.
#[derive(Debug, clap::Args)]
pub struct AuthArgs {
    #[command(subcommand)]
    command: AuthCommand,
}

#[derive(Debug, clap::Subcommand)]
enum AuthCommand {
    /// Verify an access token as `cairn serve` would (fetching its issuer's keys) and print
    /// its issuer, principal, groups, scopes and datasets, or why it is refused. Exit 0
    /// accepted, 1 refused, 2 cannot be checked now.
    Check {
        /// The access token (a JWT); `-` reads it from standard input.
        token: String,
        /// The configuration file naming `[oauth]` (also `CAIRN_CONFIG`).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

impl AuthArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let AuthCommand::Check { token, config } = self.command;
        let config = super::file_config(config, None, env)?;
        let Some(settings) = config.oauth else {
            anyhow::bail!("no [oauth] settings: name oauth.resource and [[oauth.issuers]] in the configuration file");
        };
        let token = if token == "-" {
            let mut text = String::new();
            std::io::stdin().read_line(&mut text)?;
            text.trim().to_owned()
        } else {
            token
        };
        let validator = oauth::Validator::new(&settings.resource).map_err(anyhow::Error::msg)?;
        let checked = if oauth::Validator::looks_like_jwt(&token) {
            validator.verify(&token).await
        } else {
            validator.verify_opaque(&token).await
        };
        let (report, code) = match checked {
            Ok(verified) => (
                json!({
                    "accepted": true,
                    "issuer": verified.issuer,
                    "subject": verified.subject,
                    "principal": verified.principal.identity.as_ref().map(|identity| identity.principal.clone()),
                    "groups": verified.principal.identity.as_ref().map(|identity| identity.groups.clone()),
                    "scopes": verified.principal.scopes,
                    "issuer_scopes": verified.issuer_scopes,
                    "datasets": verified.principal.datasets,
                    "expires_at": verified.expires_at,
                }),
                ExitCode::SUCCESS,
            ),
            Err(refusal) => (
                json!({
                    "accepted": false,
                    "reason": refusal.reason(),
                    "message": refusal.to_string(),
                }),
                if refusal.is_temporary() {
                    ExitCode::from(2)
                } else {
                    ExitCode::from(1)
                },
            ),
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        Ok(code)
    }
}
