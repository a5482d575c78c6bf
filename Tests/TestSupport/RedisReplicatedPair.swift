import Foundation

/// A Redis primary and its replica on loopback, in sync when made: what a managed Redis runs
/// behind its name. `failOver()` does what such a service does: the replica is promoted and the
/// primary demoted to its replica. `primary` and `replica` name the roles they start in.
public final class RedisReplicatedPair: @unchecked Sendable {
    public let primary: RedisServerProcess
    public let replica: RedisServerProcess

    public init(within limit: TimeInterval = 20) throws {
        let primary = try RedisServerProcess()
        let replica: RedisServerProcess
        do {
            replica = try RedisServerProcess(arguments: ["--replicaof", "127.0.0.1", String(primary.port)])
        } catch {
            primary.stop()
            throw error
        }
        self.primary = primary
        self.replica = replica
        do {
            try Poll.until(Date().addingTimeInterval(limit), "the replica syncs") { RedisCommand.info(port: replica.port)["master_link_status"] == "up" }
        } catch {
            stop()
            throw error
        }
    }

    /// The replica promoted, then the primary made its replica.
    public func failOver() throws {
        _ = try RedisCommand.send(["REPLICAOF", "NO", "ONE"], port: replica.port)
        _ = try RedisCommand.send(["REPLICAOF", "127.0.0.1", String(replica.port)], port: primary.port)
    }

    public func stop() {
        replica.stop()
        primary.stop()
    }
}
