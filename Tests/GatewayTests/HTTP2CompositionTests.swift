import GatewayConfig
import HTTPProxy
import Testing

@testable import Gateway

/// What the gateway gives the proxy of `server.tls.alpn`, `server.http2_cleartext` and
/// `server.http2`.
@Suite("HTTP/2 settings from the file")
struct HTTP2CompositionTests {
    @Test("the file's HTTP/2 bounds reach the proxy; the header list defaults to the head bound")
    func bounds() {
        var c = GatewayConfiguration()
        c.server.limits.maxHeaderBytes = 8192
        c.server.http2.maxConcurrentStreams = 42
        c.server.http2.maxStreamResets = 17
        var http2 = GatewayService.proxyConfiguration(c).http2
        #expect(http2.maxConcurrentStreams == 42)
        #expect(http2.maxHeaderListSize == 8192)
        #expect(http2.maxStreamResets == 17)
        #expect(http2.streamResetWindow == .seconds(10))
        c.server.http2.maxHeaderListSize = 32768
        http2 = GatewayService.proxyConfiguration(c).http2
        #expect(http2.maxHeaderListSize == 32768)
    }

    @Test("h2 by ALPN and h2c are spoken as the file says", arguments: [
        ("TLS, default ALPN", true, [GatewayConfiguration.ApplicationProtocol.h2, .http11], false, true, false),
        ("TLS, http/1.1 only", true, [.http11], false, false, false),
        ("plain, h2c on", false, [], true, false, true),
        ("plain, h2c off", false, [], false, false, false),
    ] as [(String, Bool, [GatewayConfiguration.ApplicationProtocol], Bool, Bool, Bool)])
    func offered(_ name: String, _ tls: Bool, _ alpn: [GatewayConfiguration.ApplicationProtocol], _ cleartext: Bool, _ overTLS: Bool, _ h2c: Bool) {
        var c = GatewayConfiguration()
        if tls { c.server.tls = .init(certificateFile: "/c", privateKeyFile: "/k", alpn: alpn) }
        c.server.http2Cleartext = cleartext
        let http2 = GatewayService.proxyConfiguration(c).http2
        #expect(http2.overTLS == overTLS, "\(name)")
        #expect(http2.cleartext == h2c, "\(name)")
    }
}
