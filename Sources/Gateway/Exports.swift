/// The configuration model is part of the gateway's API: every entry point takes a
/// `GatewayConfiguration`, and the CLI loads, checks and prints one. Re-exported, so that the
/// CLI imports `Gateway` alone and reaches nothing below it (README "Development": the import
/// graph, which `scripts/check-imports.sh` enforces).
@_exported import GatewayConfig
