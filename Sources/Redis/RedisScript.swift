import Crypto
import NIOCore

/// A Lua script run by its SHA-1 (`EVALSHA`): Redis takes it from its script cache instead of
/// receiving, hashing and looking up the whole text on every call. A server that does not have
/// it yet (a new, restarted, flushed or failed-over one) answers `NOSCRIPT`; the call is then
/// sent once with the text (`EVAL`), which caches it there. So scripts need no loading at
/// connect, and a cluster's nodes each learn the ones their slots use.
public struct RedisScript: Sendable {
    public let source: String
    /// Lower-case hex, as Redis names scripts.
    public let sha1: String

    public init(_ source: String) {
        self.source = source
        let digits = Array("0123456789abcdef".utf8)
        sha1 = String(decoding: Insecure.SHA1.hash(data: Array(source.utf8)).flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0x0f)]] }, as: UTF8.self)
    }
}

extension RedisCommands {
    /// Runs `script` with `keys` and `arguments` (`EVALSHA`, then `EVAL` on `NOSCRIPT`).
    public func eval(_ script: RedisScript, keys: [RedisArgument], arguments: [RedisArgument] = [], on loop: any EventLoop) -> EventLoopFuture<RESPValue> {
        var command: [RedisArgument] = ["EVALSHA", .string(script.sha1), RedisArgument(Int64(keys.count))]
        command.reserveCapacity(3 + keys.count + arguments.count)
        command += keys
        command += arguments
        return send(command, on: loop).flatMapError { [command] error in
            guard case .server(let reply) = error as? RedisError, reply.kind == .noScript else { return loop.makeFailedFuture(error) }
            var withText = command
            withText[0] = "EVAL"
            withText[1] = .string(script.source)
            return self.send(withText, on: loop)
        }
    }
}
