import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A blocking one-command Redis client over plain TCP on loopback, for tests to drive and
/// inspect their servers (not the code under test).
public enum RedisCommand {
    public indirect enum Reply: Equatable, Sendable {
        case string(String)
        case error(String)
        case integer(Int)
        case null
        case array([Reply])

        public var string: String? { if case .string(let s) = self { return s } else { return nil } }
        public var integer: Int? { if case .integer(let n) = self { return n } else { return nil } }
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Sends `arguments` to `host:port` on a new connection; the reply (seconds at most).
    /// With a `password`, `AUTH` goes first on the same connection (its refusal is thrown).
    public static func send(_ arguments: [String], port: Int, host: String = "127.0.0.1", password: String? = nil, timeout seconds: Int = 2) throws -> Reply {
        try Connection(port: port, host: host, password: password, timeout: seconds).send(arguments)
    }

    /// One connection for many commands (a resharding sends thousands), one at a time.
    public final class Connection {
        public let port: Int
        private let client: RawClient

        /// Connects to `host:port` and, with a `password`, authenticates (a refusal is
        /// thrown). `seconds`: the longest wait for any one reply.
        public init(port: Int, host: String = "127.0.0.1", password: String? = nil, timeout seconds: Int = 2) throws {
            self.port = port
            do {
                client = try RawClient(port: port, timeoutSeconds: seconds, host: host)
            } catch RawClient.Failure.connect(let code) {
                throw Failure(description: "connect to \(port): \(String(cString: strerror(code)))")
            }
            if let password, case .error(let refusal) = try send(["AUTH", password]) {
                throw Failure(description: "\(port): AUTH: \(refusal)")
            }
        }

        /// Sends one command and reads its reply (an error reply is returned, not thrown).
        public func send(_ arguments: [String]) throws -> Reply {
            var request = "*\(arguments.count)\r\n"
            for argument in arguments { request += "$\(argument.utf8.count)\r\n\(argument)\r\n" }
            do {
                try client.send(request)
                return try RedisCommand.reply(client)
            } catch let failure as RawClient.Failure {
                throw Failure(description: "\(port): \(failure)")
            }
        }
    }

    /// `INFO` as key/value pairs (empty when the server does not answer).
    public static func info(port: Int, host: String = "127.0.0.1", password: String? = nil) -> [String: String] {
        guard let text = (try? send(["INFO"], port: port, host: host, password: password))?.string else { return [:] }
        var values: [String: String] = [:]
        for line in text.split(whereSeparator: \.isNewline) {
            let parts = line.split(separator: ":", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        return values
    }

    private static func reply(_ client: RawClient) throws -> Reply {
        let header = try client.readLine()
        let rest = String(header.dropFirst())
        switch header.first {
        case "+": return .string(rest)
        case "-": return .error(rest)
        case ":": return .integer(Int(rest) ?? 0)
        case "$":
            let length = Int(rest) ?? -1
            return length < 0 ? .null : .string(String(decoding: try client.read(count: length + 2).dropLast(2), as: UTF8.self))
        case "*":
            let count = Int(rest) ?? -1
            return count < 0 ? .null : .array(try (0..<count).map { _ in try reply(client) })
        default:
            throw Failure(description: "not RESP: \(header.prefix(40))")
        }
    }
}
