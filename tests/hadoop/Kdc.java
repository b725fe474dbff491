// A Kerberos KDC for the secured test Hadoop (tests/securehadoop.py): Hadoop's MiniKdc
// (Apache Kerby's SimpleKdcServer), in a JVM of its own, and a `kinit` for machines
// without MIT Kerberos's.
//
// Run in Java's source-file mode (no build step) with the jars of tests/hadoop/minikdc-pom.xml:
//
//   java -cp 'KDCJARS/*' Kdc.java serve WORK_DIR KEYTAB PRINCIPAL...
//     starts the KDC with its data in WORK_DIR, puts every PRINCIPAL (random keys) into
//     KEYTAB and the first one alone into WORK_DIR/user.keytab, and writes WORK_DIR/krb5.conf, then WORK_DIR/ready (the realm, then the KDC's
//     port), which readers wait for. It runs until it is terminated or its standard input
//     ends (the starting process died).
//
//   java -cp 'KDCJARS/*' Kdc.java kinit KRB5_CONF KEYTAB PRINCIPAL CCACHE
//     asks the KDC that KRB5_CONF names for PRINCIPAL's ticket-granting ticket with the
//     key in KEYTAB and writes it to the credentials cache file CCACHE (MIT's format, as
//     `kinit -kt KEYTAB -c FILE:CCACHE PRINCIPAL` does).

import java.io.File;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.Arrays;
import java.util.Properties;

import org.apache.hadoop.minikdc.MiniKdc;
import org.apache.kerby.kerberos.kerb.client.KrbClient;
import org.apache.kerby.kerberos.kerb.keytab.Keytab;
import org.apache.kerby.kerberos.kerb.type.base.PrincipalName;
import org.apache.kerby.kerberos.kerb.type.ticket.TgtTicket;

public class Kdc {
  public static void main(String[] args) throws Exception {
    if (args.length >= 4 && args[0].equals("serve")) {
      serve(new File(args[1]), new File(args[2]), Arrays.copyOfRange(args, 3, args.length));
    } else if (args.length == 5 && args[0].equals("kinit")) {
      kinit(new File(args[1]), new File(args[2]), args[3], new File(args[4]));
    } else {
      System.err.println("usage: Kdc.java serve WORK_DIR KEYTAB PRINCIPAL... | kinit KRB5_CONF KEYTAB PRINCIPAL CCACHE");
      System.exit(2);
    }
  }

  static void serve(File workDir, File keytab, String[] principals) throws Exception {
    Properties conf = MiniKdc.createConf();  // realm EXAMPLE.COM, a free port on localhost, TCP
    // -Dkdc.org.name=NAME: realm NAME.COM (two KDCs that one process talks to must not share a realm:
    // MIT's library would keep one's service tickets for the other's services of the same name).
    conf.setProperty(MiniKdc.ORG_NAME, System.getProperty("kdc.org.name", "EXAMPLE"));
    MiniKdc kdc = new MiniKdc(conf, workDir);
    kdc.start();
    Runtime.getRuntime().addShutdownHook(new Thread(kdc::stop));
    kdc.createPrincipal(keytab, principals);
    // The first principal (the user's) alone, as a user's own keytab holds it: WORK_DIR/user.keytab.
    Keytab user = new Keytab();
    user.addKeytabEntries(Keytab.loadKeytab(keytab).getKeytabEntries(
        new PrincipalName(principals[0] + "@" + kdc.getRealm())));
    user.store(new File(workDir, "user.keytab"));
    // MiniKdc writes a krb5.conf for Java clients; this one also suits MIT's library (hdfs-native's
    // GSSAPI, kinit): no DNS look-ups, and "localhost" stays "localhost" in service principals.
    Files.writeString(new File(workDir, "krb5.conf").toPath(), String.join("\n",
        "[libdefaults]",
        "    default_realm = " + kdc.getRealm(),
        "    udp_preference_limit = 1",
        "    dns_lookup_kdc = false",
        "    dns_lookup_realm = false",
        "    dns_canonicalize_hostname = false",
        "    rdns = false",
        "[realms]",
        "    " + kdc.getRealm() + " = {",
        "        kdc = localhost:" + kdc.getPort(),
        "    }",
        "[domain_realm]",
        "    localhost = " + kdc.getRealm(),
        ""));
    File tmp = new File(workDir, "ready.tmp");
    Files.writeString(tmp.toPath(), kdc.getRealm() + "\n" + kdc.getPort() + "\n");
    Files.move(tmp.toPath(), new File(workDir, "ready").toPath(), StandardCopyOption.REPLACE_EXISTING);
    System.out.println("KDC ready: realm " + kdc.getRealm() + " on " + kdc.getHost() + ":" + kdc.getPort());
    // Nobody writes to our stdin: end-of-file means the process that started us is gone.
    while (System.in.read() != -1) { }
    System.exit(0);
  }

  static void kinit(File krb5Conf, File keytab, String principal, File ccache) throws Exception {
    // Kerby's client reads krb5.conf from a folder: give it one that holds only that file.
    File confDir = Files.createTempDirectory("kinit-").toFile();
    try {
      Files.copy(krb5Conf.toPath(), new File(confDir, "krb5.conf").toPath());
      KrbClient client = new KrbClient(confDir);
      client.init();
      TgtTicket tgt = client.requestTgt(principal, keytab);
      File tmp = new File(ccache.getPath() + ".tmp");
      tmp.delete();
      client.storeTicket(tgt, tmp);
      Files.move(tmp.toPath(), ccache.toPath(), StandardCopyOption.REPLACE_EXISTING);
    } finally {
      new File(confDir, "krb5.conf").delete();
      confDir.delete();
    }
  }
}
