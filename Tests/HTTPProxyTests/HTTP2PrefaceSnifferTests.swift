import NIOCore
import NIOEmbedded
import Testing

@testable import HTTPProxy

/// The h2c preface sniffer on an `EmbeddedChannel`: which protocol it picks, when, and that the
/// chosen pipeline receives every byte the client sent.
@Suite("HTTP/2 preface sniffer")
struct HTTP2PrefaceSnifferTests {
    /// Stands in for the chosen pipeline: records what reaches it.
    final class Collector: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        var received = ""
        var events: [String] = []
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var buffer = unwrapInboundIn(data)
            received += buffer.readString(length: buffer.readableBytes) ?? ""
        }
        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if let event = event as? ChannelEvent, event == .inputClosed { events.append("inputClosed") }
        }
    }

    final class Fixture {
        let channel = EmbeddedChannel()
        let collector = Collector()
        var choices: [HTTP2PrefaceSniffer.Choice] = []

        init() throws {
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
            let collector = self.collector
            try channel.pipeline.syncOperations.addHandler(HTTP2PrefaceSniffer(timeout: .seconds(30)) { [unowned self] choice, pipeline in
                self.choices.append(choice)
                try pipeline.addHandler(collector)
            })
        }

        var snifferLeft: Bool { (try? channel.pipeline.syncOperations.handler(type: HTTP2PrefaceSniffer.self)) == nil }
    }

    static let preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    @Test("an HTTP/1.1 request is handed to HTTP/1.1 at its first byte, every byte with it", arguments: ["G", "GET / HTTP/1.1\r\nhost: a\r\n\r\n", "PUT", "PRX"])
    func http1(_ first: String) throws {
        let f = try Fixture()
        try f.channel.writeInbound(ByteBuffer(string: first))
        #expect(f.choices == [.http1])
        #expect(f.collector.received == first)
        #expect(f.snifferLeft)
        try f.channel.writeInbound(ByteBuffer(string: "more"))
        #expect(f.collector.received == first + "more")
    }

    @Test("the preface split over reads is HTTP/2 once its 24 bytes are in; what follows it comes along")
    func http2() throws {
        let f = try Fixture()
        try f.channel.writeInbound(ByteBuffer(string: "PRI * HT"))
        try f.channel.writeInbound(ByteBuffer(string: "TP/2.0\r\n\r\nSM"))
        #expect(f.choices.isEmpty, "a strict prefix waits")
        try f.channel.writeInbound(ByteBuffer(string: "\r\n\r\n\u{0}\u{0}\u{0}\u{4}"))
        #expect(f.choices == [.http2])
        #expect(f.collector.received == Self.preface + "\u{0}\u{0}\u{0}\u{4}")
        #expect(f.snifferLeft)
    }

    @Test("a client that sends part of the preface and stops is closed after the timeout")
    func stalled() throws {
        let f = try Fixture()
        try f.channel.writeInbound(ByteBuffer(string: "PRI * HTTP/2.0"))
        f.channel.embeddedEventLoop.advanceTime(by: .seconds(29))
        #expect(f.channel.isActive)
        f.channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!f.channel.isActive)
        #expect(f.choices.isEmpty)
    }

    @Test("a client that ends its input before deciding is HTTP/1.1's to answer, with what it sent")
    func inputClosed() throws {
        let f = try Fixture()
        try f.channel.writeInbound(ByteBuffer(string: "PRI"))
        f.channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(f.choices == [.http1])
        #expect(f.collector.received == "PRI")
        #expect(f.collector.events == ["inputClosed"])
    }
}
