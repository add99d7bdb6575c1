use chrono::{TimeZone, Utc};
use recollect_extract::{analyse_query, parse_times, RuleExtractor};
use recollect_model::{MemoryId, ReferenceState, TenantId, Turn};

#[test]
fn probe() {
    let a = Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap();
    let convo = [
        ("Caroline", "Hey Mel! Good to see you! How have you been?"),
        ("Melanie", "Hey Caroline! Good to see you! I'm swamped with the kids & work. What's up with you? Anything new?"),
        ("Caroline", "I went to a LGBTQ support group yesterday and it was so powerful."),
        ("Melanie", "Wow, that's cool, Caroline! What happened that was so awesome? Did you hear any inspiring stories?"),
        ("Caroline", "The transgender stories were so inspiring! I was so happy and thankful for all the support."),
        ("Melanie", "Wow, love that painting! So cool you found such a helpful group. What's it done for you?"),
        ("Caroline", "The support group has made me feel accepted and given me courage to embrace myself."),
        ("Melanie", "I ran a charity race for mental health last Saturday – it was really rewarding. Really made me think about taking care of our minds."),
        ("Caroline", "That charity race sounds great, Mel! Making a difference & raising awareness for mental health is super rewarding - I'm really proud of you for taking part!"),
        ("Melanie", "Thanks, Caroline! The event was really thought-provoking. I'm starting to realize that self-care is really important. I'm off to go swimming with the kids. Talk to you soon!"),
        ("Caroline", "Since I'm considering counseling and mental health, I'd like to work with trans people. We took the kids to the museum in Boston two weeks ago and they loved it there."),
        ("Melanie", "My daughter Sarah is going to Europe next summer. She is so excited about Paris."),
        ("Caroline", "Oh nice! Has she been there before? I remember my trip to Sweden back then."),
    ];
    let x = RuleExtractor::new();
    let mut st = ReferenceState::default();
    let tenant = TenantId::default_tenant();
    for (i, (sp, text)) in convo.iter().enumerate() {
        let other = if *sp == "Caroline" {
            "Melanie"
        } else {
            "Caroline"
        };
        let t = Turn {
            memory_id: MemoryId::derive(&tenant, "c", &i.to_string()),
            tenant: tenant.clone(),
            conversation_id: "c".into(),
            turn_id: i.to_string(),
            position: i as u64,
            user: text.to_string(),
            assistant: String::new(),
            user_speaker: Some(sp.to_string()),
            assistant_speaker: Some(other.to_string()),
            timestamp: a,
            recorded_at: a,
            metadata: Default::default(),
        };
        let ex = x.extract_sync(&t, &mut st);
        println!("\n== {sp}: {text}");
        println!(
            "  kw: {:?}",
            ex.keywords
                .iter()
                .map(|k| k.text.as_str())
                .collect::<Vec<_>>()
        );
        println!(
            "  ent: {:?} loc: {:?} ev: {:?}",
            ex.entities, ex.locations, ex.events
        );
        println!(
            "  times: {:?}",
            ex.times
                .iter()
                .map(|t| format!("{}={}", t.text, t.key()))
                .collect::<Vec<_>>()
        );
        println!(
            "  refs: {:?}",
            ex.references
                .iter()
                .map(|r| format!("{}->{}:{}", r.mention, r.kind, r.resolved))
                .collect::<Vec<_>>()
        );
    }
    for q in [
        "When did Caroline go to the LGBTQ support group?",
        "What did Melanie paint recently?",
        "Would Caroline likely pursue counseling?",
        "How many times has Melanie gone to the beach in 2023?",
        "What fields would Caroline be likely to pursue in her educaton?",
        "When is Melanie planning on going camping?",
        "Where has Melanie camped?",
    ] {
        let qa = analyse_query(q, Some(a), Some(&st));
        println!("\nQ {q}\n  {:?}", qa);
    }
    for s in [
        "We met on the 3rd.",
        "I'll see you in a bit",
        "It's been 5 years since I moved",
        "I have been married for 5 years",
        "Since 2016 I've been painting",
        "my birthday is on July 4th",
        "The 2000s were fun",
        "at 5 pm on Monday",
        "I was born in 1990",
        "a year and a half ago",
        "last couple of days",
        "the next day",
        "in a week or two",
    ] {
        println!(
            "{s:?} -> {:?}",
            parse_times(s, a)
                .iter()
                .map(|t| format!("{}={}", t.text, t.key()))
                .collect::<Vec<_>>()
        );
    }
}
