import NIOCore

/// What the session store asks of Redis, whatever the deployment: one server (standalone, or the
/// master the sentinels name: `RedisClient`) or a cluster whose client routes each command to
/// the master of its key's slot (`RedisClusterClient`).
public protocol RedisCommands: Sendable {
    /// One command.
    func send(_ arguments: [RedisArgument], on eventLoop: (any EventLoop)?) -> EventLoopFuture<RESPValue>
    /// Commands written back to back, their replies in order; fails if any command fails. A
    /// `MULTI`…`EXEC` block stays one block and must touch keys of one hash slot; on a cluster,
    /// a pipeline of other commands may span slots.
    func sendAll(_ commands: [[RedisArgument]], on eventLoop: (any EventLoop)?) -> EventLoopFuture<[RESPValue]>
    /// Every key matching `pattern` (`SCAN`, never the blocking `KEYS`), on every master.
    func scan(matching pattern: String, on eventLoop: any EventLoop) -> EventLoopFuture<[String]>
    /// Closes every connection.
    func close() async
}

extension RedisCommands {
    public func send(_ arguments: [RedisArgument]) async throws -> RESPValue {
        try await send(arguments, on: nil).get()
    }
}

extension RedisClient: RedisCommands {
    public func scan(matching pattern: String, on eventLoop: any EventLoop) -> EventLoopFuture<[String]> {
        scan(pattern, cursor: "0", found: [], on: eventLoop)
    }

    private func scan(_ pattern: String, cursor: String, found: [String], on loop: any EventLoop) -> EventLoopFuture<[String]> {
        send(["SCAN", .string(cursor), "MATCH", .string(pattern), "COUNT", "1000"], on: loop).flatMap { reply in
            guard case .array(let parts?) = reply, parts.count == 2, let next = parts[0].string, case .array(let keys?) = parts[1] else {
                return loop.makeFailedFuture(RedisError.protocolError("unexpected reply to SCAN"))
            }
            let all = found + keys.compactMap(\.string)
            return next == "0" ? loop.makeSucceededFuture(all) : self.scan(pattern, cursor: next, found: all, on: loop)
        }
    }
}
