import Redis

/// Why the store failed, by kind: what Sessions makes of a Redis error, so that the gateway acts
/// on (and explains) kinds and never reads Redis's text or imports Redis.
public enum StoreFault: Equatable, Sendable {
    /// Not connected: refused, dropped, or the bytes were not RESP.
    case unreachable
    /// No answer within the timeout.
    case timeout
    /// The server is a replica: `READONLY` to a write, `ROLE` at connect, or behind sentinels
    /// the server named is not the master. A failover in progress, or a name not yet moved.
    case readOnly
    /// The server is loading its data after a restart.
    case loading
    /// `maxmemory` reached: writes refused.
    case outOfMemory
    /// A long script (`BUSY`) or a replica that lost its master (`MASTERDOWN`).
    case busy
    /// The user or password was refused (`WRONGPASS`, `NOAUTH`).
    case authentication
    /// The ACL user may not run the command (`NOPERM`).
    case noPermission
    /// The command is renamed away or unknown to this version.
    case refusedCommand
    /// `SELECT` of a database the server does not have.
    case noDatabase
    /// TLS: the server's certificate is not signed by the CA or does not name the host; or the
    /// handshake failed otherwise (a client certificate refused).
    case untrustedCertificate
    case tlsHandshake
    /// Sentinel: none answered; none knows the master's name.
    case noSentinel
    case unknownMaster
    /// The store answered something this client cannot read, or a command's own error.
    case other

    public init(_ error: any Error) {
        switch error {
        case let error as SessionStoreError: self = error.fault
        case let error as RedisError: self.init(error)
        default: self = .other
        }
    }

    init(_ error: RedisError) {
        switch error {
        case .server(let reply):
            switch reply.kind {
            case .readOnly: self = .readOnly
            case .loading: self = .loading
            case .outOfMemory: self = .outOfMemory
            case .busy, .masterDown: self = .busy
            case .authentication: self = .authentication
            case .noPermission: self = .noPermission
            case .unknownCommand: self = .refusedCommand
            case .noDatabase: self = .noDatabase
            case .clusterDown, .tryAgain: self = .unreachable
            case .moved, .ask, .noScript, .other: self = .other
            }
        case .timeout: self = .timeout
        case .unavailable, .protocolError: self = .unreachable
        case .tls(let detail): self = detail.contains("CERTIFICATE_VERIFY_FAILED") ? .untrustedCertificate : .tlsHandshake
        case .sentinel: self = .noSentinel
        case .unknownMaster: self = .unknownMaster
        case .notMaster: self = .readOnly
        }
    }
}
