import Logging
import NIOCore
import NIOPosix
import TestSupport
import Testing

@testable import Redis

/// The fleet channel on a Redis Cluster: classic pub/sub, which the cluster broadcasts, heard on
/// whichever node the subscriber is on — and on another one once that node is gone.
@Suite("Redis pub/sub on a Redis Cluster", .serialized, .timeLimit(.minutes(2)))
struct RedisClusterSubscriberTests {
    @Test("a message published through any master reaches a subscriber on any node; its node killed, it subscribes on another and hears again")
    func followsALostNode() async throws {
        let cluster = try await blocking { try RedisClusterProcesses() }
        defer { cluster.stop() }
        let nodes = cluster.ports.map { RedisAddress(host: "127.0.0.1", port: $0) }
        let configuration = RedisClient.Configuration(host: "127.0.0.1", commandTimeout: .seconds(3),
                                                      minimumBackoff: .milliseconds(20), maximumBackoff: .milliseconds(200))
        let (events, sink) = AsyncStream.makeStream(of: RedisSubscriberTests.Event.self)
        let subscriber = try RedisSubscriber(configuration: configuration, anyOf: nodes, channels: ["sg:invalidate"],
                                             eventLoop: MultiThreadedEventLoopGroup.singleton.next(), logger: Logger(label: "test"),
                                             onMessage: { channel, payload in sink.yield(.message(channel, String(decoding: payload, as: UTF8.self))) },
                                             onConnected: { sink.yield(.connected) })
        let publisher = try RedisClusterClient(configuration: .init(seeds: nodes, node: configuration), group: .singleton, logger: Logger(label: "test"))
        subscriber.start()
        var iterator = events.makeAsyncIterator()
        #expect(await iterator.next() == .connected)
        _ = try await publisher.send(["PUBLISH", "sg:invalidate", "user 001"])
        #expect(await iterator.next() == .message("sg:invalidate", "user 001"))

        // The node it listens on (whichever kind it is) goes away.
        let listening = try #require(cluster.ports.first { port in
            guard case .array(let parts)? = try? cluster.send(["PUBSUB", "NUMSUB", "sg:invalidate"], port: port), parts.count == 2,
                  case .integer(let count) = parts[1] else { return false }
            return count == 1
        })
        try #require(cluster.server(on: listening)).crash()
        #expect(await iterator.next() == .connected, "subscribed again elsewhere (and the cache flushed)")
        // Published until heard (20 s at most, then the stream ends): a killed master takes its
        // slots with it until its replica is promoted, but PUBLISH goes to any master.
        let publishing = Task {
            for i in 0..<400 where !Task.isCancelled {
                _ = try? await publisher.send(["PUBLISH", "sg:invalidate", .string("session \(i)")])
                try? await Task.sleep(for: .milliseconds(50))
            }
            sink.finish()
        }
        let next = await iterator.next()
        publishing.cancel()
        var heard = false
        if case .message(_, let payload)? = next { heard = payload.hasPrefix("session ") }
        #expect(heard, "a message published after the loss reaches the subscriber on its new node")
        await subscriber.stop()
        await publisher.close()
        sink.finish()
    }
}
