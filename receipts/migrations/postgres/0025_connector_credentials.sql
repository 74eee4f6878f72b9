-- cairn ledger, schema 25: the credentials a connector that reads a remote uses.
--
-- - `connectors.credentials`: the name of a file inside the workers' credentials folder
--   (`connectors.credentials_dir`) that holds an HTTP token or basic credentials, or an SSH
--   key and its `known_hosts` (`connectors::remote`). The ledger holds the name, never the
--   secret. NULL: the environment's credentials, or none.
ALTER TABLE connectors ADD COLUMN credentials TEXT;
