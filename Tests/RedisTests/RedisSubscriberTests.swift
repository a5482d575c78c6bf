import TestSupport
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import Redis

@Suite("Redis pub/sub subscriber against redis-server", .serialized, .timeLimit(.minutes(1)))
struct RedisSubscriberTests {
    enum Event: Equatable, Sendable {
        case connected
        case message(String, String)
    }

    /// A subscriber to `sg:invalidate` whose connections and messages arrive as events.
    static func subscriber(_ configuration: RedisClient.Configuration) throws -> (RedisSubscriber, AsyncStream<Event>, AsyncStream<Event>.Continuation) {
        let (events, sink) = AsyncStream.makeStream(of: Event.self)
        let subscriber = try RedisSubscriber(
            configuration: configuration, channels: ["sg:invalidate"], eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
            logger: Logger(label: "test"),
            onMessage: { channel, payload in sink.yield(.message(channel, String(decoding: payload, as: UTF8.self))) },
            onConnected: { sink.yield(.connected) })
        return (subscriber, events, sink)
    }

    @Test("messages arrive; after Redis restarts the subscriber reconnects, reports it, and receives again")
    func subscribeAndReconnect() async throws {
        let server = try RedisServerProcess(arguments: ["--requirepass", "pw"])
        defer { server.stop() }
        // Commands get seconds: the suites share 2 cores (a clean run once saw the first PUBLISH
        // take over 250 ms); the reconnect is what this test is about.
        let configuration = RedisClient.Configuration(host: "127.0.0.1", port: server.port, password: "pw", commandTimeout: .seconds(3),
                                                      minimumBackoff: .milliseconds(20), maximumBackoff: .milliseconds(200))
        let (subscriber, events, sink) = try Self.subscriber(configuration)
        let publisher = try RedisClient(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
        subscriber.start()
        var iterator = events.makeAsyncIterator()
        #expect(await iterator.next() == .connected)
        #expect(try await publisher.send(["PUBLISH", "sg:invalidate", "user 001"]).int == 1)
        #expect(await iterator.next() == .message("sg:invalidate", "user 001"))

        server.stop()
        try server.start()
        #expect(await iterator.next() == .connected, "a reconnect is reported (the cache must be flushed)")
        var delivered = 0
        for _ in 0..<50 where delivered == 0 {
            delivered = Int((try? await publisher.send(["PUBLISH", "sg:invalidate", "session abc"]).int) ?? 0)
            if delivered == 0 { try await Task.sleep(for: .milliseconds(10)) }  // pacing: the publisher reconnects too
        }
        #expect(delivered == 1)
        #expect(await iterator.next() == .message("sg:invalidate", "session abc"))
        await subscriber.stop()
        await publisher.close()
        sink.finish()
    }

    @Test("an ACL user (redis://user:password@…) authenticates the command and the pub/sub connections; the default user is off")
    func aclUser() async throws {
        let server = try RedisServerProcess(arguments: ["--user", "default", "off", "--user", "gateway", "on", ">s3cret", "~*", "&*", "+@all"])
        defer { server.stop() }
        let configuration = RedisClient.Configuration(host: "127.0.0.1", port: server.port, username: "gateway", password: "s3cret",
                                                      commandTimeout: .seconds(3), minimumBackoff: .milliseconds(20), maximumBackoff: .milliseconds(200))
        let (subscriber, events, sink) = try Self.subscriber(configuration)
        let client = try RedisClient(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
        subscriber.start()
        var iterator = events.makeAsyncIterator()
        #expect(await iterator.next() == .connected)
        #expect(try await client.send(["ACL", "WHOAMI"]).string == "gateway")
        #expect(try await client.send(["PUBLISH", "sg:invalidate", "user 002"]).int == 1)
        #expect(await iterator.next() == .message("sg:invalidate", "user 002"))

        var wrong = configuration
        wrong.password = "nope"
        let refused = try RedisClient(configuration: wrong, group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
        await #expect(throws: RedisError.self) { try await refused.send(["PING"]) }
        var anonymous = configuration
        anonymous.username = nil
        anonymous.password = nil
        let unauthenticated = try RedisClient(configuration: anonymous, group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
        await #expect(throws: RedisError.self) { try await unauthenticated.send(["PING"]) }
        await subscriber.stop()
        await client.close()
        await refused.close()
        await unauthenticated.close()
        sink.finish()
    }
}
