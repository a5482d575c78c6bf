import AppleIDSimulator
import ArgumentParser
import Crypto
import Foundation
import Gateway
import Logging
import NIOPosix
import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#endif

@main
struct SessionGateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sessiongate",
        abstract: "A reverse proxy that admits only requests backed by a Sign in with Apple session.",
        discussion: """
            Configuration reference: conf/sessiongate.yaml (every key, annotated, with its default).
            SIGHUP re-reads the configuration; SIGTERM or SIGINT fails /readyz, keeps serving for
            server.timeouts.drain_delay (default 0), then drains in-flight requests and exits.
            """,
        version: "sessiongate \(BuildInfo.version) (Swift \(BuildInfo.swift))",
        subcommands: [Serve.self, Check.self, Reload.self, Demo.self, AppleSimulatorCommand.self, SessionsCommand.self, MigrateCommand.self],
        defaultSubcommand: Serve.self
    )
}

struct ConfigOption: ParsableArguments {
    @Option(name: .long, help: "Path of the YAML configuration file.")
    var config: String = "conf/sessiongate.yaml"
}

/// Loads a configuration, printing every problem to standard error; nil when there are errors.
func loadConfiguration(_ path: String, printWarnings: Bool = true) -> GatewayConfiguration.LoadResult? {
    let result = GatewayConfiguration.load(file: path)
    for problem in result.problems where problem.severity == .error || printWarnings {
        printError("\(path):\(problem)")
    }
    return result.configuration == nil ? nil : result
}

/// A start-up error as `file:line:col: error: key: message` when it belongs to a key.
func describe(_ error: any Error, file: String, locations: [String: ConfigLocation]) -> String {
    if let failure = error as? StartupFailure { return "\(file):\(failure.problem(locations: locations))" }
    return "\(file): error: \(error)"
}

/// A line on standard error, in order with the log lines written before it.
func printError(_ line: String) {
    LineSink.standardError.write(line + "\n")
}

/// Writes out what the logs still hold (every command's exit path).
func flushLogs() {
    LineSink.standardError.flush()
    LineSink.standardOutput.flush()
}

/// The main log on standard error, as `server.log` says (text, info before a file is read).
func makeLogger(_ settings: GatewayConfiguration.Log = .init()) -> Logger {
    let level: Logger.Level
    switch settings.level {
    case .debug: level = .debug
    case .info: level = .info
    case .notice: level = .notice
    case .warning: level = .warning
    case .error: level = .error
    }
    return Logger(label: "sessiongate") { _ in
        LineLogHandler(format: settings.format == .json ? .json : .text, level: level)
    }
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the gateway.")

    @OptionGroup var options: ConfigOption

    func run() async throws {
        // A closed log pipe must not kill the gateway (NIO's sockets never raise SIGPIPE).
        signal(SIGPIPE, SIG_IGN)
        defer { flushLogs() }
        guard let loaded = loadConfiguration(options.config), let configuration = loaded.configuration else { throw ExitCode(1) }
        let logger = makeLogger(configuration.server.log)
        let service: GatewayService
        do {
            service = try GatewayService(configuration: configuration, configPath: options.config, logger: logger)
        } catch {
            printError(describe(error, file: options.config, locations: loaded.locations))
            throw ExitCode(1)
        }
        let group = ServiceGroup(configuration: .init(
            services: [.init(service: service)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        do {
            try await group.run()
        } catch {
            // A JSON log gets the problem as a JSON line, its parts as fields.
            if configuration.server.log.format == .json, let failure = error as? StartupFailure {
                logger.log(failure.problem(locations: loaded.locations), file: options.config)
            } else {
                printError(describe(error, file: options.config, locations: loaded.locations))
            }
            throw ExitCode(1)
        }
    }
}

struct Check: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Validate a configuration file.",
        discussion: """
            Prints every problem with its key path and line:column, or 'ok'. Exit status 1 if there is any error.
            Runs everything serve runs before it binds: reads and parses every secret and key file (TLS certificates
            too: each key must fit its certificate, which must be valid now; under 14 days left is a warning), resolves every
            host name, and test-binds the listen addresses (skipped with --reload), so that a file check passes is one
            serve starts with.
            With --online it also fetches Apple's keys, mints a client secret for every client id and proves Apple
            accepts it (exchanging a made-up code must give invalid_grant, not invalid_client), and connects to the
            store as serve will (TLS, ACL user, database, Sentinel or Cluster discovery), writes, reads and deletes a
            test key under store.key_prefix and loads the scripts: a failed step is named with its key and line.
            With --transfer it prints the app-transfer checklist (sessiongate migrate) with the store's progress.
            """)

    @OptionGroup var options: ConfigOption

    @Flag(help: "Also check the apple: section against Apple (apple.base_url) and the store against Redis.")
    var online = false

    @Flag(help: "Check a file for a running gateway's reload: its listen addresses are in use by that gateway, so they are not test-bound, and the gateway at server.admin_listen tries its file without swapping (a key that applies only at restart is named).")
    var reload = false

    @Flag(help: "Also print the app-transfer checklist, with where this configuration's store stands (sessiongate migrate). A report: the listen addresses are not test-bound.")
    var transfer = false

    func run() async throws {
        defer { flushLogs() }
        let result = GatewayConfiguration.load(file: options.config)
        for problem in result.problems { print("\(options.config):\(problem)") }
        guard let configuration = result.configuration else { throw ExitCode(1) }
        var logger = makeLogger()
        logger.logLevel = .error
        // What serve does before it binds, then the binds themselves.
        var failures: [any Error] = []
        do {
            for warning in try await GatewayService.preflight(configuration, logger: logger) {
                print("\(options.config):\(warning.problem(locations: result.locations, severity: .warning))")
            }
        } catch { failures.append(error) }
        // A report on a live host (--transfer) or a file for a running gateway (--reload) must
        // not bind: that gateway holds the addresses.
        if !reload && !transfer { failures += await GatewayService.probeListeners(configuration) as [any Error] }
        for failure in failures { print(describe(failure, file: options.config, locations: result.locations)) }
        guard failures.isEmpty else { throw ExitCode(1) }
        if online {
            let (ok, lines) = await AppleOnlineCheck.run(configuration, logger: logger)
            for line in lines { print(line) }
            // The store's connection failures are logged with their cause (refused, reset).
            var storeLogger = logger
            storeLogger.logLevel = .warning
            let store = await StoreOnlineCheck.run(configuration, logger: storeLogger)
            switch store {
            case .ok(let warnings, let line):
                for warning in warnings { print("\(options.config):\(warning.problem(locations: result.locations, severity: .warning))") }
                print(line)
            case .failed(let failure): print(describe(failure, file: options.config, locations: result.locations))
            }
            guard ok, case .ok = store else { throw ExitCode(1) }
        }
        if reload {
            // What the running gateway makes of its file, tried without swapping: a key that
            // applies only at restart is found here, not at the SIGHUP.
            switch await AdminReload.ask(configuration, dryRun: true) {
            case .success(let answer): try Reload.report(answer)
            case .failure(let failure): print("note: \(failure); nothing running to compare with")
            }
        }
        if transfer {
            if configuration.store.redisURL != nil, let store = try? SessionsCommand.store(options.config).0 {
                for line in await store.transferChecklist(configuration) { print(line) }
                await store.shutdown()
            } else {
                let reason = configuration.store.redisURL == nil ? "store.redis_url is not set; migrate needs Redis" : "the store cannot be reached"
                for line in await TransferChecklist.lines(configuration, store: .failure(MigrationError(reason))) { print(line) }
            }
        }
        print("ok")
    }
}

struct Reload: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Ask the running gateway to reload its configuration file, and say whether it did.",
        discussion: """
            Posts to the admin listener named by the file (server.admin_listen, POST /reload): the gateway that \
            listens there re-reads its own file as on SIGHUP. Prints its answer: ok, or each reason it refused \
            the file (a key that applies only at restart changed) or rejected it (errors), one file:line:col: \
            error: line each. Exit status 0 when it reloaded; 1 when it refused or rejected the file, or no \
            gateway answers. The systemd unit's ExecReload runs it, so systemctl reload fails when the reload does.
            """)

    @OptionGroup var options: ConfigOption

    /// Prints the gateway's answer; exit status 1 unless it reloaded (or, dry, would).
    static func report(_ answer: AdminReload.Answer) throws {
        for line in answer.lines { print(line) }
        guard answer.accepted else { throw ExitCode(1) }
    }

    func run() async throws {
        defer { flushLogs() }
        guard let configuration = loadConfiguration(options.config, printWarnings: false)?.configuration else { throw ExitCode(1) }
        switch await AdminReload.ask(configuration, dryRun: false) {
        case .success(let answer):
            try Self.report(answer)
        case .failure(let failure):
            printError("\(options.config): error: \(failure)")
            throw ExitCode(1)
        }
    }
}

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the demo: the Apple ID simulator, a demo upstream and the gateway in front of it, on loopback.",
        discussion: """
            Reads conf/demo.yaml: the simulator listens at apple.base_url with that team, key id and
            client ids (the .p8 key is generated and written to apple.private_key_file); the demo
            upstream listens at the last route's upstream; the gateway uses the memory store.
            Open the printed URL, pick a test user on the simulator's consent page, and land on the
            demo upstream, which shows who you are.
            """)

    @Option(name: .long, help: "Path of the demo configuration.")
    var config: String = "conf/demo.yaml"

    func run() async throws {
        signal(SIGPIPE, SIG_IGN)
        defer { flushLogs() }
        guard var configuration = loadConfiguration(config, printWarnings: false)?.configuration, let apple = configuration.apple,
              let upstreamURL = configuration.routes.last?.upstream else { throw ExitCode(1) }
        guard case .file(let keyPath) = apple.privateKeyFile, let base = ListenAddress.parse(String(apple.baseURL.split(separator: "/").last ?? "")),
              let publicURL = configuration.server.publicURL else {
            printError("\(config): the demo needs apple.private_key_file as a path, apple.base_url as http://host:port and server.public_url")
            throw ExitCode(1)
        }
        let logger = makeLogger()
        let group = MultiThreadedEventLoopGroup.singleton
        // The simulator is Apple for this demo: the team's key, the web client with our callback.
        let key = P256.Signing.PrivateKey()
        try FileManager.default.createDirectory(atPath: (keyPath as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        guard FileManager.default.createFile(atPath: keyPath, contents: Data(key.pemRepresentation.utf8), attributes: [.posixPermissions: 0o600]) else {
            printError("cannot write \(keyPath)")
            throw ExitCode(1)
        }
        // The links API's secret, made for this run: the demo page shows how the app links an
        // Apple ID to one of its accounts.
        var linkSecret: String? = nil
        if case .file(let secretPath)? = configuration.identity.linksSecretFile {
            let secret = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
            guard FileManager.default.createFile(atPath: secretPath, contents: Data(secret.utf8), attributes: [.posixPermissions: 0o600]) else {
                printError("cannot write \(secretPath)")
                throw ExitCode(1)
            }
            linkSecret = secret
        }
        var clients: [String: [String]] = [apple.clientIDs[0]: [publicURL + configuration.server.authPrefix + "/callback"]]
        for app in apple.clientIDs.dropFirst() { clients[app] = [] }
        let simulator = try await SimulatedAppleID.start(
            team: .init(teamID: apple.teamID, keys: [apple.keyID: key.publicKey], clients: clients, allowsLoopbackHTTP: true), host: base.host, port: base.port, group: group)
        simulator.createUser(privateEmail: true, firstName: "Jane", lastName: "Appleseed")
        simulator.createUser(email: "john@example.org", privateEmail: false, firstName: "John", lastName: "Doe")
        configuration.apple?.baseURL = simulator.baseURL
        let upstream = try await DemoUpstream.start(host: upstreamURL.host, port: upstreamURL.port, group: group,
                                                    linking: linkSecret.map { (links: publicURL + configuration.server.authPrefix + "/links", secret: $0) })
        let service = try GatewayService(configuration: configuration, configPath: nil, logger: logger)
        let serviceGroup = ServiceGroup(configuration: .init(
            services: [.init(service: service)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        let banner = Task {
            await service.waitUntilStarted()
            // Unbuffered, so the URL shows at once even when the output is piped (make, tee).
            FileHandle.standardOutput.write(Data("""

                SessionGate demo is running.
                  Open:       \(publicURL)/        (sign in with Apple on the simulator's consent page)
                  Public:     \(publicURL)/public/ (no sign-in needed)
                  Sign out:   \(publicURL)\(configuration.server.authPrefix)/logout
                  Apple:      \(simulator.baseURL)  (the Apple ID simulator; test users: Jane Appleseed, John Doe)
                  Upstream:   \(upstreamURL) (the demo app; it shows the headers it receives, and how to link an account)
                  Metrics:    http://\(configuration.server.adminListen.host):\(configuration.server.adminListen.port)/metrics
                Ctrl-C stops it.

                """.utf8))
        }
        try await serviceGroup.run()
        banner.cancel()
        await upstream.close()
        await simulator.stop()
    }
}
