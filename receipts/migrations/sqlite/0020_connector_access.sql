-- cairn ledger, schema 20: who may read the sources a connector keeps.
--
-- - `connectors.access`: the connector's access settings as JSON
--   (`receipts::model::ConnectorAccess`): readers for every file, `from: posix` for a folder,
--   a rules `file` for git. `{}` (every connector made before this schema): the connector
--   never touches access.
ALTER TABLE connectors ADD COLUMN access TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(access));
