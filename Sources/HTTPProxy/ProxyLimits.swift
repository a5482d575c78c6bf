/// The data path's caps on client requests and connections (`server.limits` in the file;
/// `Gateway` converts). Every default is the file's default.
public struct ProxyLimits: Sendable, Equatable {
    /// Request line plus header block, in bytes; beyond it: 431.
    public var maxHeaderBytes: Int
    /// Number of header fields; beyond it: 431.
    public var maxHeaderCount: Int
    /// Open client connections on this server (the instance); beyond it: 503 with `Retry-After`,
    /// closed. 0: no cap.
    public var maxConnections: Int
    /// Open client connections per peer address; beyond it: 503, closed. A connection from a
    /// trusted proxy carries many clients and counts only against `maxConnections`. 0: no cap.
    public var maxConnectionsPerClient: Int
    /// Idle upstream connections kept on this server, split across its event loops.
    public var maxIdleUpstreamConnections: Int

    public init(maxHeaderBytes: Int = 16 * 1024, maxHeaderCount: Int = 100, maxConnections: Int = 0, maxConnectionsPerClient: Int = 0,
                maxIdleUpstreamConnections: Int = 512) {
        self.maxIdleUpstreamConnections = maxIdleUpstreamConnections
        self.maxHeaderBytes = maxHeaderBytes
        self.maxHeaderCount = maxHeaderCount
        self.maxConnections = maxConnections
        self.maxConnectionsPerClient = maxConnectionsPerClient
    }
}
