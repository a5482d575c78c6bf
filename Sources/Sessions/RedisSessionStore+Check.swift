import NIOCore
import Redis

/// The steps of `RedisSessionStore.check`, in the order they run.
public enum StoreCheckStep: String, Sendable, CaseIterable {
    /// `PING` on a new connection: the dial, TLS, `AUTH`, `SELECT`, and the Sentinel or Cluster
    /// discovery before them.
    case connect
    /// `SET` of a test key under the key prefix (a read-only replica or an ACL without writes
    /// fails here).
    case write
    case read
    case delete
    /// `SCRIPT LOAD` of every script the store runs (scripting disabled, or an ACL without it).
    case scripts
}

/// The first step of `RedisSessionStore.check` that failed, and why (a `RedisError` mostly).
public struct StoreCheckFailure: Error, Sendable, CustomStringConvertible {
    public let step: StoreCheckStep
    public let error: any Error

    public var description: String { "\(step.rawValue): \(error)" }

    /// What failed, by kind.
    public var fault: StoreFault { StoreFault(error) }

    /// What the server said, for the operator: its error reply as sent, or the failure.
    public var detail: String {
        if case .server(let reply) = error as? RedisError { return reply.message }
        return "\(error)"
    }
}

extension RedisSessionStore {
    /// Every Lua script the store runs.
    static var scripts: [RedisScript] { [loadScript, claimAccountScript, deleteIfScript, markerScript] }

    /// What `sessiongate check --online` proves about the store before any traffic: that this
    /// client reaches it as `serve` will, writes, reads and deletes a key under the key prefix
    /// (`<prefix>check:{<random>}`, gone after a minute if the delete never runs), and may run
    /// its scripts. Nil when every step passed; else the first that failed.
    public func check(on loop: any EventLoop) async -> StoreCheckFailure? {
        let key = "\(prefix)check:{\(UInt64.random(in: 0 ... .max))}"
        let value = "sessiongate check"
        var step = StoreCheckStep.connect
        do {
            _ = try await redis.send(["PING"], on: loop).get()  // not ping(on:): its error would no longer say why
            step = .write
            _ = try await redis.send(["SET", .string(key), .string(value), "PX", "60000"], on: loop).get()
            step = .read
            let read = try await redis.send(["GET", .string(key)], on: loop).get()
            guard read.string == value else { throw SessionStoreError("the test key read back as \(read.string.map { "'\($0)'" } ?? "nothing")") }
            step = .delete
            _ = try await redis.send(["DEL", .string(key)], on: loop).get()
            step = .scripts
            for script in Self.scripts { _ = try await redis.send(["SCRIPT", "LOAD", .string(script.source)], on: loop).get() }
        } catch {
            return StoreCheckFailure(step: step, error: error)
        }
        return nil
    }
}
