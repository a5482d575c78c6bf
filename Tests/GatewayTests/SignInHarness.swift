import AppleIDSimulator
import AsyncHTTPClient
import Crypto
import Foundation
import Gateway
import GatewayConfig
import HTTPProxy
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle
import Sessions
import NIOConcurrencyHelpers
import TestSupport

/// The whole product on loopback: the Apple ID simulator on `127.0.0.1`, the gateway on
/// `localhost` (another site, so Apple's callback is a cross-site POST as in production), a real
/// upstream, and the memory store or a real Redis.
final class SignInHarness: @unchecked Sendable {
    static let webClient = "com.example.web"
    static let appClient = "com.example.app"

    let simulator: SimulatedAppleID
    let upstream: TestUpstream
    let service: GatewayService
    let redis: TestRedis?
    let configuration: GatewayConfiguration
    let gatewayPort: Int
    private let group: ServiceGroup
    private let runTask: Task<Void, any Error>
    let directory: String
    /// The gateways' session clock (every instance shares it).
    let clock: TestClock

    var origin: String { "http://localhost:\(gatewayPort)" }

    enum Store { case memory, redis }

    /// Runs `body` with the whole product started; every part of it (extra instances too) is
    /// stopped before this returns or rethrows.
    ///
    /// `storeTimeout` is 3 s, not the shipped 250 ms: the suites share 2 cores (a sign-in's save
    /// once took over 1 s). It was 10 s while the 1 GiB streaming test pumped its app side on the
    /// process's shared event loops and starved every gateway here past 3 s; that test has loops
    /// of its own now. Tests of the timeout pass their own.
    static func with<Result>(store: Store = .memory, redis existing: TestRedis? = nil, storeTimeout: Duration = .seconds(3),
                             localCacheTTL: Duration = .seconds(5), idleTimeout: Duration = .seconds(3600), absoluteTimeout: Duration = .seconds(86_400),
                             assertion: Bool = false, clock: TestClock = TestClock(), teamID: String = "TEAM123456", ledger: TransferLedger = TransferLedger(),
                             logs: LogRecorder? = nil, loops: MultiThreadedEventLoopGroup = .singleton,
                             configure: (inout GatewayConfiguration) -> Void = { _ in }, _ body: (SignInHarness) async throws -> Result) async throws -> Result {
        let harness = try await start(store: store, redis: existing, storeTimeout: storeTimeout, localCacheTTL: localCacheTTL, idleTimeout: idleTimeout,
                                      absoluteTimeout: absoluteTimeout, assertion: assertion, clock: clock, teamID: teamID, ledger: ledger, logs: logs,
                                      loops: loops, configure: configure)
        return try await withTeardown(harness, stop: { await $0.stop() }, body)
    }

    private static func start(store: Store, redis existing: TestRedis?, storeTimeout: Duration, localCacheTTL: Duration, idleTimeout: Duration,
                              absoluteTimeout: Duration, assertion: Bool, clock: TestClock, teamID: String, ledger: TransferLedger, logs: LogRecorder?,
                              loops: MultiThreadedEventLoopGroup, configure: (inout GatewayConfiguration) -> Void) async throws -> SignInHarness {
        let directory = NSTemporaryDirectory() + "sessiongate-test-\(UInt64.random(in: 0 ... .max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let appleKey = P256.Signing.PrivateKey()
        try appleKey.pemRepresentation.write(toFile: directory + "/AuthKey.p8", atomically: true, encoding: .utf8)
        try Data((0..<64).map { _ in UInt8.random(in: 0 ... 255) }).write(to: URL(fileURLWithPath: directory + "/session.key"))
        try P256.Signing.PrivateKey().pemRepresentation.write(toFile: directory + "/assertion.pem", atomically: true, encoding: .utf8)

        let reserved = ReservedPort()  // held until the gateway listens on it
        let gatewayPort = reserved.port
        let origin = "http://localhost:\(gatewayPort)"
        let simulator = try await SimulatedAppleID.start(team: .init(
            teamID: teamID, keys: ["KEY1234567": appleKey.publicKey],
            clients: [webClient: [origin + "/_auth/callback"], appClient: []], allowsLoopbackHTTP: true), ledger: ledger)
        let upstream = try await TestUpstream.start()

        var c = GatewayConfiguration()
        c.server.listen = ListenAddress(host: "127.0.0.1", port: gatewayPort)
        c.server.adminListen = ListenAddress(host: "127.0.0.1", port: 0)
        c.server.publicURL = origin
        c.server.accessLog = .off
        c.server.allowedRedirectHosts = ["docs.example.com", ".example.net"]
        var apple = GatewayConfiguration.Apple()
        apple.teamID = teamID
        apple.keyID = "KEY1234567"
        apple.clientIDs = [webClient, appClient]
        apple.privateKeyFile = .file(directory + "/AuthKey.p8")
        apple.baseURL = simulator.baseURL
        apple.timeout = .seconds(5)
        c.apple = apple
        c.session.secretFile = .file(directory + "/session.key")
        c.session.idleTimeout = idleTimeout
        c.session.absoluteTimeout = absoluteTimeout
        c.store.timeout = storeTimeout
        c.store.localCacheTTL = localCacheTTL
        var redis = existing
        if store == .redis {
            if redis == nil { redis = try TestRedis.start() }
            c.store.redisURL = RedisURL.parse("redis://\(redis!.host):\(redis!.port)/\(redis!.database)")
            c.store.keyPrefix = TestRedis.uniquePrefix()
        }
        if assertion {
            c.identity.assertion.enabled = true
            c.identity.assertion.keyFile = .file(directory + "/assertion.pem")
        }
        let up = UpstreamURL(host: "127.0.0.1", port: upstream.port)
        var staff = GatewayConfiguration.Allow()
        staff.emailDomains = ["example.org"]
        c.routes = [
            .init(name: "api", pathPrefix: "/api/", upstream: up, auth: .required, unauthenticated: .deny),
            .init(name: "public", pathPrefix: "/public/", upstream: up, auth: .public),
            .init(name: "optional", pathPrefix: "/maybe/", upstream: up, auth: .optional),
            .init(name: "staff", pathPrefix: "/staff/", upstream: up, auth: .required, allow: staff),
            .init(name: "app", pathPrefix: "/", upstream: up, auth: .required, unauthenticated: .redirect),
        ]
        configure(&c)
        var logger = logs.map { recorder in Logger(label: "gateway-test") { _ in recorder } } ?? Logger(label: "gateway-test")
        logger.logLevel = logs == nil ? .warning : .debug
        let service = try GatewayService(configuration: c, configPath: nil, group: loops, logger: logger, clock: clock.now)
        let group = ServiceGroup(configuration: .init(services: [.init(service: service)], gracefulShutdownSignals: [], logger: logger))
        let runTask = Task { try await group.run() }
        await service.waitUntilStarted()
        withExtendedLifetime(reserved) {}
        return SignInHarness(simulator: simulator, upstream: upstream, service: service, redis: redis, configuration: c,
                             gatewayPort: gatewayPort, group: group, runTask: runTask, directory: directory, clock: clock)
    }

    private init(simulator: SimulatedAppleID, upstream: TestUpstream, service: GatewayService, redis: TestRedis?, configuration: GatewayConfiguration,
                 gatewayPort: Int, group: ServiceGroup, runTask: Task<Void, any Error>, directory: String, clock: TestClock) {
        self.clock = clock
        self.simulator = simulator
        self.upstream = upstream
        self.service = service
        self.redis = redis
        self.configuration = configuration
        self.gatewayPort = gatewayPort
        self.group = group
        self.runTask = runTask
        self.directory = directory
    }

    /// Another gateway instance with the same configuration (same Redis, secret, simulator) on
    /// its own port, changed by `configure`: a fleet of two. Stopped with the harness.
    func addInstance(logs: LogRecorder? = nil, configure: (inout GatewayConfiguration) -> Void = { _ in }) async throws -> (service: GatewayService, origin: String) {
        var c = configuration
        configure(&c)
        let reserved = ReservedPort()  // held until the instance listens on it
        let port = reserved.port
        c.server.listen = ListenAddress(host: "127.0.0.1", port: port)
        var logger = logs.map { recorder in Logger(label: "gateway-test-b") { _ in recorder } } ?? Logger(label: "gateway-test-b")
        logger.logLevel = .warning
        let service = try GatewayService(configuration: c, configPath: nil, logger: logger, clock: clock.now)
        let group = ServiceGroup(configuration: .init(services: [.init(service: service)], gracefulShutdownSignals: [], logger: logger))
        let task = Task { try await group.run() }
        extraInstances.append((service, group, task))
        await service.waitUntilStarted()
        withExtendedLifetime(reserved) {}
        return (service, "http://localhost:\(port)")
    }

    private var extraInstances: [(GatewayService, ServiceGroup, Task<Void, any Error>)] = []

    /// Stops an instance `addInstance` started (as SIGTERM would), before the harness stops.
    func stopInstance(_ service: GatewayService) async {
        guard let i = extraInstances.firstIndex(where: { $0.0 === service }) else { return }
        let (_, group, task) = extraInstances.remove(at: i)
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }

    private func stop() async {
        for (_, group, task) in extraInstances {
            await group.triggerGracefulShutdown()
            _ = try? await task.value
        }
        await group.triggerGracefulShutdown()
        _ = try? await runTask.value
        await simulator.stop()
        await upstream.close()
        redis?.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// A minimal browser: follows nothing by itself, keeps the gateway's cookies (the simulator
/// sets none), and sends them only to the gateway's origin.
final class TestBrowser: @unchecked Sendable {
    /// Up to 256 connections per gateway, so that concurrent requests (200 at once in the
    /// single-flight test) each have one and none queues: AsyncHTTPClient bounds a request's
    /// wait for a pooled connection (8 per host by default) by the connect timeout, which a
    /// queue of 200 ran past in full runs (the connect timeout was 30 s for a while for that).
    static let http = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(
        redirectConfiguration: .disallow, timeout: .init(connect: .seconds(5), read: .seconds(10)),
        connectionPool: .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 256)))

    let gatewayOrigin: String
    var cookies: [String: String] = [:]
    /// Every `Set-Cookie` line seen, in order.
    var setCookies: [String] = []

    init(gatewayOrigin: String) { self.gatewayOrigin = gatewayOrigin }

    struct Response {
        var status: Int
        var headers: HTTPHeaders
        var body: String
        var location: String? { headers.first(name: "location") }
    }

    func request(_ url: String, method: HTTPMethod = .GET, headers: [(String, String)] = [("accept", "text/html")], form: [(String, String)]? = nil,
                 json: String? = nil, sendCookies: Bool = true) async throws -> Response {
        let absolute = url.hasPrefix("/") ? gatewayOrigin + url : url
        var request = HTTPClientRequest(url: absolute)
        request.method = method
        for (n, v) in headers { request.headers.add(name: n, value: v) }
        if sendCookies, absolute.hasPrefix(gatewayOrigin), !cookies.isEmpty {
            request.headers.add(name: "cookie", value: cookies.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "; "))
        }
        if let form {
            request.headers.replaceOrAdd(name: "content-type", value: "application/x-www-form-urlencoded")
            request.body = .bytes(ByteBuffer(string: FormBody.encode(form)))
        }
        if let json {
            request.headers.replaceOrAdd(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: json))
        }
        let response = try await Self.http.execute(request, timeout: .seconds(15))
        let body = try await response.body.collect(upTo: 1 << 20)
        if absolute.hasPrefix(gatewayOrigin) {
            for line in response.headers["set-cookie"] {
                setCookies.append(line)
                let pair = line.split(separator: ";")[0]
                let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let name = String(parts[0])
                let value = parts.count > 1 ? String(parts[1]) : ""
                if line.contains("Max-Age=0") || value.isEmpty { cookies[name] = nil } else { cookies[name] = value }
            }
        }
        return Response(status: Int(response.status.code), headers: response.headers, body: String(buffer: body))
    }

    /// The hidden inputs and action of the (first) form in a page.
    static func form(in html: String) -> (action: String, fields: [(String, String)]) {
        func attribute(_ name: String, in tag: Substring) -> String? {
            guard let start = tag.range(of: "\(name)=\"") else { return nil }
            let rest = tag[start.upperBound...]
            return rest.firstIndex(of: "\"").map { unescape(String(rest[..<$0])) }
        }
        var fields: [(String, String)] = []
        var action = ""
        for piece in html.components(separatedBy: "<").dropFirst() {
            let tag = Substring(piece.prefix { $0 != ">" })
            if tag.hasPrefix("form"), action.isEmpty { action = attribute("action", in: tag) ?? "" }
            if tag.hasPrefix("input"), tag.contains("type=\"hidden\""), let name = attribute("name", in: tag) {
                fields.append((name, attribute("value", in: tag) ?? ""))
            }
        }
        return (action, fields)
    }

    static func unescape(_ s: String) -> String {
        s.replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&#39;", with: "'").replacingOccurrences(of: "&lt;", with: "<")
            .replacingOccurrences(of: "&gt;", with: ">").replacingOccurrences(of: "&amp;", with: "&")
    }

    /// Follows the web flow from a protected page to the page after sign-in: the gateway's
    /// redirect, the sign-in page's button, Apple's consent page (choosing `sub`), the
    /// auto-submitting form_post to the callback. Returns the callback's response.
    func signIn(from path: String, as sub: String, prefix: String = "/_auth", stopBeforeCallback: Bool = false) async throws -> (callback: Response?, form: (action: String, fields: [(String, String)])) {
        // Signed in already (or a planted cookie): go to the sign-in page as a user would.
        let first = try await request(path)
        let signInURL = first.status == 302 ? first.location ?? "" : "\(prefix)/sign-in?rd=\(FormBody.escape(path))"
        let page = try await request(signInURL)
        // The button's link: `<auth_prefix>/login?rd=…`.
        guard page.status == 200, let loginRange = page.body.range(of: "/login?rd="),
              let hrefRange = page.body[..<loginRange.lowerBound].range(of: "href=\"", options: .backwards) else { throw Failure.unexpected("sign-in page: \(page.status)") }
        let href = TestBrowser.unescape(String(page.body[hrefRange.upperBound...].prefix { $0 != "\"" }))
        return try await signIn(login: href, as: sub, stopBeforeCallback: stopBeforeCallback)
    }

    /// The web flow from the login URL on: Apple's consent page (choosing `sub`), the
    /// auto-submitting form_post to the callback. Returns the callback's response.
    func signIn(login href: String, as sub: String, stopBeforeCallback: Bool = false) async throws -> (callback: Response?, form: (action: String, fields: [(String, String)])) {
        let login = try await request(href)
        guard login.status == 302, let authorize = login.location else { throw Failure.unexpected("login: \(login.status) \(login.body)") }
        let consent = try await request(authorize)
        let consentForm = TestBrowser.form(in: consent.body)
        let simulatorOrigin = String(authorize.prefix { $0 != "/" }) + "//" + authorize.dropFirst(authorize.prefix { $0 != "/" }.count + 2).prefix { $0 != "/" }
        let delivered = try await request(simulatorOrigin + consentForm.action, method: .POST, form: consentForm.fields + [("sub", sub)])
        let post = TestBrowser.form(in: delivered.body)
        if stopBeforeCallback { return (nil, post) }
        let callback = try await request(post.action, method: .POST, form: post.fields)
        // Every caller expects a session: say why there is none (a load-dependent timeout shows here).
        guard callback.status == 303 else { throw Failure.unexpected("callback: \(callback.status) \(Self.visibleText(callback.body).prefix(400))") }
        return (callback, post)
    }

    enum Failure: Error { case unexpected(String) }

    /// A page's text without its markup and style, for failure messages.
    static func visibleText(_ html: String) -> String {
        let body = html.range(of: "<body").map { String(html[$0.lowerBound...]) } ?? html
        var text = "", inTag = false
        for c in body {
            if c == "<" { inTag = true } else if c == ">" { inTag = false; text += " " } else if !inTag { text.append(c) }
        }
        return text.split(whereSeparator: \.isWhitespace).joined(separator: " ")
    }
}

/// The wall clock plus an offset tests move forward (Unix milliseconds), or, once frozen, a
/// fixed instant that only `advance` moves (for a test whose windows must not end while a loaded
/// machine runs it slowly).
final class TestClock: Sendable {
    private let offset = NIOLockedValueBox<Int64>(0)
    private let frozen = NIOLockedValueBox<Int64?>(nil)
    init() {}
    var now: @Sendable () -> Int64 {
        { [offset, frozen] in frozen.withLockedValue { $0 } ?? SessionClock.now() + offset.withLockedValue { $0 } }
    }
    func advance(by duration: Duration) {
        offset.withLockedValue { $0 += duration.components.seconds * 1000 }
        frozen.withLockedValue { if let t = $0 { $0 = t + duration.components.seconds * 1000 } }
    }
    /// Stops the clock where it is.
    func freeze() {
        let t = now()
        frozen.withLockedValue { $0 = t }
    }
}

/// Every line the gateway logs, at every level, with its metadata (`SignInHarness.with(logs:)`).
final class LogRecorder: LogHandler, Sendable {
    private let lines = NIOLockedValueBox<[String]>([])
    var all: [String] { lines.withLockedValue { $0 } }

    func log(event: LogEvent) {
        let fields = (event.metadata ?? [:]).map { "\($0.key)=\($0.value)" }.sorted().joined(separator: " ")
        lines.withLockedValue { $0.append("\(event.level) \(event.message) \(fields)") }
    }

    subscript(metadataKey _: String) -> Logger.Metadata.Value? {
        get { nil }
        set {}
    }
    var metadata: Logger.Metadata {
        get { [:] }
        set {}
    }
    var logLevel: Logger.Level {
        get { .trace }
        set {}
    }
}

/// Polls `request` every `interval` until it answers `status`; when it first did (nil: not
/// within `limit`).
func firstTime(_ status: Int, within limit: Duration, every interval: Duration = .milliseconds(100),
               _ request: () async throws -> Int) async throws -> ContinuousClock.Instant? {
    let deadline = ContinuousClock.now + limit
    while ContinuousClock.now < deadline {
        if try await request() == status { return .now }
        try await Task.sleep(for: interval)
    }
    return nil
}

extension SignInHarness {
    /// `with` on a redis-server of the test's own, to kill, freeze or restart (stopped after).
    static func withOwnRedis<Result>(storeTimeout: Duration = .seconds(3), localCacheTTL: Duration = .seconds(5), logs: LogRecorder? = nil,
                                     configure: (inout GatewayConfiguration) -> Void = { _ in },
                                     _ body: (SignInHarness, RedisServerProcess) async throws -> Result) async throws -> Result {
        let redis = try RedisServerProcess()
        defer { redis.stop() }
        return try await with(store: .redis, redis: TestRedis(host: "127.0.0.1", port: redis.port, database: 0, process: nil),
                              storeTimeout: storeTimeout, localCacheTTL: localCacheTTL, logs: logs, configure: configure) { try await body($0, redis) }
    }

    /// GET `path` on the admin listener (this harness's, or another instance's `port`): its status and body.
    func admin(_ path: String, port: Int? = nil) async throws -> (Int, String) {
        guard let port = port ?? service.adminAddress?.port else { throw TestBrowser.Failure.unexpected("no admin listener") }
        let answer = try await TestBrowser(gatewayOrigin: origin).request("http://127.0.0.1:\(port)\(path)")
        return (answer.status, answer.body)
    }

    /// The lines of `/metrics` that start with `prefix`.
    func metricLines(_ prefix: String, port: Int? = nil) async throws -> [String] {
        try await admin("/metrics", port: port).1.split(separator: "\n").filter { $0.hasPrefix(prefix) }.map(String.init)
    }

    /// One series' value as rendered ("1.0" for a gauge, "1" for a counter); nil: not exported.
    func metric(_ series: String, port: Int? = nil) async throws -> String? {
        try await metricLines(series + " ", port: port).first.map { String($0.dropFirst(series.count + 1)) }
    }
}
